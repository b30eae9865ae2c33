"""Tool-integrated math as a `HostEnv` (the ToRL / SimpleTIR turn format), token in, token out.

A turn is the policy's text up to the end of a ```python block (a stop sequence) or of its message. A block is
run in the sandbox, after the episode's earlier blocks (each cell sees their variables), and its output comes
back as "```output\\n...\\n```\\n" tokens. A turn without a block ends the episode: the episode's actions, decoded
together (what evaluation logs as its response), are graded by the verifier (reward 1 or 0; `verifier.answer_of`:
the last box after the last `</think>`). After max_tool_calls blocks, the next turn is the answer, whatever it
holds.

Stateful (`HostEnv.stateful`): an episode's interpreter state is the cells of its earlier turns that ran to their
end or raised (a cell stopped by a limit is left out of later replays), each with the `Result` it got, kept per
(question, actions so far) by `StatefulHostEnv`; a fork mid-episode replays exactly its anchor's cells, which
reproduce what they printed (their clock readings replayed, the same seeds on every worker) or are reported in the
observation and counted (`diverged`). The snapshot cache holds a whole step's histories (`cache_size`), so no
anchor is rebuilt from a replay of its turns, whose results would be new ones.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from transformers import PreTrainedTokenizerBase

from trace_jax.envs.math.config import MathConfig
from trace_jax.envs.math.sandbox import Result, SandboxPool, observation
from trace_jax.envs.math.verifier import Verifier
from trace_jax.envs.stateful import StatefulHostEnv

INSTRUCTION = (
    "Solve the following math problem. You may write Python code in a ```python block; it is run and its output "
    "is shown to you in a ```output block. Put your final answer in \\boxed{{}}.\n\nProblem: {problem}\n")
CODE = re.compile(r"```python\n(.*?)```", re.DOTALL)
KEPT = ("ok", "error")  # a cell that ended so is replayed in later turns; one stopped by a limit is not


def prompt_ids(tokenizer: PreTrainedTokenizerBase, problem: str) -> list[int]:
    """A problem's chat prompt, through the tokenizer's own chat template."""
    messages = [{"role": "user", "content": INSTRUCTION.format(problem=problem.strip())}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


def code_of(text: str) -> str | None:
    """The turn's last ```python block, or None."""
    blocks = CODE.findall(text)
    return blocks[-1] if blocks else None


State = list[tuple[str, Result]]  # the cells kept so far and the results they got when they ran


def cache_size(slots: int, max_turns: int) -> int:
    """Snapshots kept for a step whose rollouts fill `slots` slots (roots and continuations) of up to max_turns
    turns each: every history the step stores, twice over (an evaluation between steps, a chunked step)."""
    return max(4096, 2 * slots * max_turns)


class MathEnv(StatefulHostEnv):
    """Batched over slots; question ids index `answers`. A turn's programs run concurrently in `sandbox`; the
    episodes that answer are graded together by `verifier`. `diverged`: programs whose replay printed otherwise."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, answers: Sequence[str], cfg: MathConfig,
                 sandbox: SandboxPool, verifier: Verifier, cache_size: int = 4096):
        super().__init__(cache_size)
        self.diverged = 0
        self.tokenizer, self.answers, self.cfg = tokenizer, list(answers), cfg
        self.sandbox, self.verifier = sandbox, verifier
        self._grader = ThreadPoolExecutor(1, thread_name_prefix="math-verifier")
        self.max_turns, self.action_len, self.obs_len = cfg.max_turns, cfg.action_len, cfg.obs_len
        encode = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))
        ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        self.stop_ids = tuple(sorted(i for i in ends if isinstance(i, int) and i != tokenizer.unk_token_id))
        self.stop_sequences = tuple(dict.fromkeys(encode(s) for s in ("```\n", "```\n\n")))
        self._open, self._close = list(encode("```output\n")), list(encode("\n```\n"))
        self._room = cfg.obs_len - len(self._open) - len(self._close)
        if self._room < 1:
            raise ValueError(f"task.obs_len={cfg.obs_len} leaves no room for output between the fences "
                             f"({len(self._open) + len(self._close)} tokens)")

    # StatefulHostEnv: the state is the list of cells a later cell replays
    def fresh(self, question: int) -> State:
        return []

    def act(self, state: State, question: int, turn: int, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        """One slot's turn alone (the replay path; `step` batches the same logic)."""
        (obs, reward, done, after), = self._turns([state], [question], [turn], [action], [[]])
        state[:] = after
        return obs, reward, done

    def error_observation(self, exc: Exception) -> np.ndarray:
        return np.asarray(self._wrap(f"Sandbox error: {type(exc).__name__}"), np.int32)

    def snapshot(self, state: State) -> State:
        return list(state)

    def _wrap(self, text: str) -> list[int]:
        body = self.tokenizer.encode(text, add_special_tokens=False)[: self._room]
        return self._open + body + self._close

    def _turns(self, states: list[State], questions: Sequence[int], turns: Sequence[int],
               actions: Sequence[np.ndarray], pasts: Sequence[Sequence[np.ndarray]]
               ) -> list[tuple[np.ndarray, float, bool, State]]:
        """Several slots' turns, their code run together, their answers graded together: per slot (observation ids,
        reward, done, the state after the turn). pasts: each slot's earlier actions, graded with its answer (`act`,
        the replay path, passes none: a replayed turn ran code, so it grades nothing)."""
        texts = self.tokenizer.batch_decode([list(map(int, a)) for a in actions], skip_special_tokens=True)
        codes = [code_of(t) if turn < self.cfg.max_tool_calls else None for t, turn in zip(texts, turns)]
        runs = [i for i, c in enumerate(codes) if c is not None]
        answering = [i for i, c in enumerate(codes) if c is None]
        episodes = self.tokenizer.batch_decode([np.concatenate([*pasts[i], actions[i]]).tolist() for i in answering],
                                               skip_special_tokens=True)  # as `evaluate_qa.responses` decodes them
        graded = self._grader.submit(self.verifier.scores, [self.answers[questions[i]] for i in answering],
                                     episodes)  # the verifier's processes work while the
        results = dict(zip(runs, self.sandbox.run_many([[*(c for c, _ in states[i]), codes[i]] for i in runs],
                                                       [[r for _, r in states[i]] for i in runs])))  # sandbox's do
        scores = dict(zip(answering, graded.result()))
        out = []
        for i in range(len(actions)):
            if i in scores:
                out.append((np.zeros(0, np.int32), scores[i], True, states[i]))
                continue
            result = results[i]
            self.diverged += result.diverged >= 0
            after = [*states[i], (codes[i], result)] if result.status in KEPT else states[i]
            out.append((np.asarray(self._wrap(observation(result, self.cfg.sandbox)), np.int32), 0.0, False, after))
        return out

    def step(self, question: np.ndarray, turn: np.ndarray, live: np.ndarray, action: np.ndarray,
             action_len: np.ndarray, past_actions: list[list[np.ndarray]]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`HostEnv.step` (stateful): every live slot's turn, its state restored from its earlier actions."""
        s = len(question)
        obs, obs_len = np.zeros((s, self.obs_len), np.int32), np.zeros(s, np.int32)
        reward, done = np.zeros(s, np.float32), np.zeros(s, bool)
        slots = np.flatnonzero(live).tolist()
        histories, states, acts, pasts = [], [], [], []
        for i in slots:
            past = [np.asarray(a, np.int32) for a in past_actions[i]]
            histories.append((int(question[i]), *(a.tobytes() for a in past)))
            states.append(self._restore(histories[-1], past))
            acts.append(np.asarray(action[i, : action_len[i]], np.int32))
            pasts.append(past)
        try:
            got = self._turns(states, [int(question[i]) for i in slots], [int(turn[i]) for i in slots], acts, pasts)
        except Exception as exc:  # never out of step: each slot gets the error, its state as before the turn
            got = [(self.error_observation(exc), 0.0, False, state) for state in states]
        for i, history, act, (o, r, d, after) in zip(slots, histories, acts, got):
            o = o[: self.obs_len]
            obs[i, : len(o)], obs_len[i], reward[i], done[i] = o, len(o), r, d
            self._keep((*history, act.tobytes()), self.snapshot(after))
        return obs, obs_len, reward, done
