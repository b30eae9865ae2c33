"""The tiny offline math kit, written in a minute: what the tests and a CPU demo run on.

`write_tiny_math(out)` writes
  problems/train.jsonl, problems/eval/kit.jsonl   generated problems (`problems.py`) in the DeepScaleR format
  policy/                                         a tiny Qwen3 checkpoint and a byte-level BPE tokenizer with a
                                                  Qwen3-style chat template, fine-tuned on scripted episodes:
                                                  write the problem's program, read its output, box it
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from trace_jax.data.search_qa_tiny import fit_episodes, random_qwen3, train_tokenizer
from trace_jax.envs.math.config import MathConfig
from trace_jax.envs.math.env import INSTRUCTION, MathEnv, prompt_ids
from trace_jax.envs.math.problems import Problem, generate
from trace_jax.envs.math.sandbox import SandboxPool
from trace_jax.envs.math.verifier import Verifier
from trace_jax.models.hf_io import save_pretrained

TINY = MathConfig(max_tool_calls=2, action_len=80, obs_len=16, prompt_len=96)  # configs/math_tiny.yaml shapes


def tool_turn(problem: Problem) -> str:
    return f"Let me compute it.\n```python\n{problem.code}\n```\n"


def answer_turn(value: str) -> str:
    return f"So the answer is \\boxed{{{value}}}."


def scripted_episode(env: MathEnv, question: int, problem: Problem) -> tuple[list[int], list[bool]]:
    """(tokens, policy mask) of compute-then-answer, the observation from `env` itself (as a rollout has it), its
    output boxed as the answer."""
    tok = env.tokenizer
    call = tok.encode(tool_turn(problem), add_special_tokens=False)
    act = np.zeros((1, env.action_len), np.int32)
    act[0, : len(call)] = call
    obs, obs_len, _, _ = env.step(np.array([question]), np.array([0]), np.array([True]), act, np.array([len(call)]),
                                  past_actions=[[]])
    seen = obs[0, : obs_len[0]].tolist()
    printed = tok.decode(seen).removeprefix("```output\n").removesuffix("\n```\n")  # boxed as read, e.g. 93/22
    reply = tok.encode(answer_turn(printed), add_special_tokens=False) + [tok.eos_token_id]
    prompt = prompt_ids(tok, problem.problem)
    return (prompt + call + seen + reply,
            [False] * len(prompt) + [True] * len(call) + [False] * len(seen) + [True] * len(reply))


def fine_tune(model, tokenizer: PreTrainedTokenizerBase, problems: list[Problem], steps: int, seed: int) -> None:
    """Adam steps on scripted episodes of the training problems (in place)."""
    with SandboxPool(TINY.sandbox) as sandbox, Verifier() as verifier:
        env = MathEnv(tokenizer, [p.answer for p in problems], TINY, sandbox, verifier)
        episodes = [scripted_episode(env, i, p) for i, p in enumerate(problems)]
    fit_episodes(model, episodes, tokenizer.pad_token_id, steps, seed)


def write_tiny_math(out_dir: str | Path, train: int = 96, evaluate: int = 16, seed: int = 0,
                    sft_steps: int = 300) -> Path:
    """Writes the kit under out_dir (see the module docstring); returns out_dir. sft_steps=0: a random policy."""
    out = Path(out_dir)
    (out / "problems" / "eval").mkdir(parents=True, exist_ok=True)
    problems = generate(train + evaluate, seed)
    for path, rows in ((out / "problems" / "train.jsonl", problems[:train]),
                       (out / "problems" / "eval" / "kit.jsonl", problems[train:])):
        path.write_text("".join(json.dumps(p.row(i, path.stem)) + "\n" for i, p in enumerate(rows)))
    texts = [INSTRUCTION.format(problem=p.problem) + tool_turn(p) + answer_turn(p.answer) for p in problems]
    tokenizer = train_tokenizer(texts + ["```output\n0\n```\n", "Timeout MemoryError Sandbox error"], vocab_size=1000)
    policy = out / "policy"
    tokenizer.save_pretrained(policy)
    model = random_qwen3(len(tokenizer), seed)
    if sft_steps:
        fine_tune(model, tokenizer, problems[:train], sft_steps, seed)
    save_pretrained(model, policy)
    return out
