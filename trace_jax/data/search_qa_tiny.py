"""A tiny offline Search QA setup, written in seconds: what the tests, the demo config and the Colab
notebook run on when no real checkpoint, corpus or dataset is at hand.

`write_tiny_search_qa(out)` writes
  corpus.jsonl                 passages in the wiki-18 format about made-up people and cities
  qa/nq/{train,test}.jsonl     questions in the Search-R1/FlashRAG format (JSONL)
  qa/hotpotqa/dev.parquet      the same format as parquet
  index/                       the corpus's BM25 index (`trace-jax retrieve serve --index`)
  policy/                      a tiny Qwen3 checkpoint (config.json, model.safetensors) and, beside it,
                               a byte-level BPE tokenizer trained here with a Qwen3-style chat template.
                               The policy starts from random weights and is fine-tuned on scripted episodes (search
                               the person, answer the city) so that it searches and is sometimes right.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pyarrow as pa
import pyarrow.parquet as pq
from flax import nnx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trace_jax.envs.search_qa.config import SearchQAConfig
from trace_jax.envs.search_qa.env import INSTRUCTION, SearchQAEnv, prompt_ids
from trace_jax.envs.search_qa.protocol import INVALID_OBSERVATION
from trace_jax.models import ModelConfig, Policy
from trace_jax.models.hf_io import save_pretrained
from trace_jax.retrieval.bm25 import Bm25Index, build_index
from trace_jax.sft import train_step as sft_step
from trace_jax.sharding import init_policy

# Qwen3's chat format (its template without the tool and thinking branches)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TINY_ACTION_LEN, TINY_OBS_LEN = 32, 64  # the turn shapes of configs/searchqa_tiny.yaml
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SYLLABLES = ["ka", "lo", "mi", "ren", "tas", "vo", "zu", "bel", "dor", "fi", "gan", "hu"]


def _name(rng: np.random.Generator) -> str:
    return "".join(rng.choice(SYLLABLES, size=3)).capitalize()


def _facts(num_people: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cities = [_name(rng) for _ in range(max(4, num_people // 4))]
    return [{"person": _name(rng) + " " + _name(rng), "city": str(rng.choice(cities)),
             "year": int(rng.integers(1800, 2000))} for _ in range(num_people)]


def write_tiny_search_qa(out_dir: str | Path, num_people: int = 48, seed: int = 0, sft_steps: int = 300) -> Path:
    """Write the kit under out_dir (see the module docstring); returns out_dir. sft_steps=0: a random policy."""
    out = Path(out_dir)
    (out / "qa" / "nq").mkdir(parents=True, exist_ok=True)
    (out / "qa" / "hotpotqa").mkdir(parents=True, exist_ok=True)
    facts = _facts(num_people, seed)
    corpus = [{"id": str(i), "contents": f'"{f["person"]}"\n{f["person"]} was born in {f["city"]} in {f["year"]}.'}
              for i, f in enumerate(facts)]
    (out / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    qa = [{"id": f"q{i}", "question": f"where was {f['person']} born?", "golden_answers": [f["city"]],
           "data_source": "nq"} for i, f in enumerate(facts)]
    half = len(qa) * 3 // 4
    for split, rows in (("train", qa[:half]), ("test", qa[half:])):
        (out / "qa" / "nq" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    hot = [{"id": f"h{i}", "question": f"in which year was {f['person']} born?", "golden_answers": [str(f["year"])],
            "data_source": "hotpotqa"} for i, f in enumerate(facts[:16])]
    pq.write_table(pa.Table.from_pylist(hot), out / "qa" / "hotpotqa" / "dev.parquet")
    tokenizer = train_tokenizer([d["contents"] for d in corpus] + [r["question"] for r in qa + hot])
    policy = out / "policy"
    tokenizer.save_pretrained(policy)
    model = random_qwen3(len(tokenizer), seed)
    if sft_steps:
        index = Bm25Index(build_index(out / "corpus.jsonl", out / "index"))
        fine_tune(model, tokenizer, index, qa[:half], sft_steps, seed)
    save_pretrained(model, policy)
    return out


def train_tokenizer(texts: list[str], vocab_size: int = 600) -> PreTrainedTokenizerFast:
    """A byte-level BPE (as Qwen's) trained on texts plus the protocol's own text, with Qwen's special tokens."""
    protocol = [INSTRUCTION, INVALID_OBSERVATION, "<think> </think> <search> </search> <answer> </answer> "
                "<information> </information> Doc 1(Title: x)"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts + protocol * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def random_qwen3(vocab_size: int, seed: int = 0) -> Policy:
    cfg = ModelConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, rope_theta=1e4, tie_word_embeddings=True)
    return init_policy(cfg, seed)


def scripted_episode(env: SearchQAEnv, question_id: int, question: str, person: str, answer: str
                     ) -> tuple[list[int], list[bool]]:
    """(tokens, policy mask) of search-then-answer, the observation from `env` itself (as a rollout has it)."""
    tok = env.tokenizer
    search = tok.encode(f"<think> look it up </think>\n<search> {person} </search>", add_special_tokens=False)
    act = np.zeros((1, env.action_len), np.int32)
    act[0, : len(search)] = search
    obs, obs_len, _, _ = env.step(np.array([question_id]), np.array([0]), np.array([True]), act,
                                  np.array([len(search)]))
    reply = tok.encode(f"<think> found it </think>\n<answer> {answer} </answer>", add_special_tokens=False)
    prompt, seen = prompt_ids(tok, question), obs[0, : obs_len[0]].tolist()
    return (prompt + search + seen + reply,
            [False] * len(prompt) + [True] * len(search) + [False] * len(seen) + [True] * len(reply))


def fine_tune(model: Policy, tokenizer: PreTrainedTokenizerFast, index: Bm25Index, qa: list[dict], steps: int,
              seed: int) -> None:
    """A few hundred Adam steps on scripted episodes of the training questions (in place)."""
    env = SearchQAEnv(tokenizer, [r["golden_answers"] for r in qa],
                      lambda qs: [[{"document": d} for d in ds] for ds in index.search(qs, 3)[0]],
                      SearchQAConfig(max_turns=3, action_len=TINY_ACTION_LEN, obs_len=TINY_OBS_LEN))
    episodes = [scripted_episode(env, i, r["question"], r["question"][len("where was "):-len(" born?")],
                                 r["golden_answers"][0]) for i, r in enumerate(qa)]
    fit_episodes(model, episodes, tokenizer.pad_token_id, steps, seed)


def fit_episodes(model: Policy, episodes: list[tuple[list[int], list[bool]]], pad_id: int, steps: int,
                 seed: int) -> None:
    """Adam steps (batches of 16) on (tokens, policy mask) episodes, the masked tokens' log-likelihood (in place):
    how a tiny kit's policy learns its scripted episodes."""
    width = max(len(t) for t, _ in episodes)
    tokens = np.full((len(episodes), width), pad_id, np.int32)
    mask = np.zeros((len(episodes), width), bool)
    for i, (t, m) in enumerate(episodes):
        tokens[i, : len(t)], mask[i, : len(m)] = t, m
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        rows = rng.choice(len(tokens), min(16, len(tokens)), replace=False)
        sft_step(model, optimizer, jnp.asarray(tokens[rows]), jnp.asarray(mask[rows]))
