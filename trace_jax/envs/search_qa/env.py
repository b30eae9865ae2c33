"""Search QA as a `HostEnv`: the policy searches a corpus through a retriever and answers (Search-R1).

Token in, token out: a turn's tokens are decoded only to parse the action; each observation is
tokenised once and appended as ids, so the trained tokens are exactly the sampled ones.
A turn ends at `</search>` or `</answer>` (as token sequences; see `stop_sequences`) or at the
end-of-message token. The reward is the exact match of the answer against the gold answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from trace_jax.envs.search_qa.answers import exact_match
from trace_jax.envs.search_qa.config import SearchQAConfig
from trace_jax.envs.search_qa.protocol import INVALID_OBSERVATION, STOP_STRINGS, format_passages, parse_action

# Search-R1's instruction (scripts/data_process/nq_search.py), the user message of every prompt.
INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For "
    "example, <answer> Beijing </answer>. Question: {question}\n"
)
INFO_OPEN, INFO_CLOSE = "\n\n<information>", "</information>\n\n"

Retrieve = Callable[[list[str]], list[list[dict]]]  # queries -> hits {"document": {"contents"}, ...} per query


def prompt_ids(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    """The chat prompt of a question, tokenised by the tokenizer's own chat template."""
    messages = [{"role": "user", "content": INSTRUCTION.format(question=question.strip())}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


class SearchQAEnv:
    """Batched over slots; question ids index `golds`. `retrieve` is called once per turn with every
    live slot's query (e.g. `RetrieverClient.retrieve`); its errors stop the run."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, golds: Sequence[Sequence[str]], retrieve: Retrieve,
                 cfg: SearchQAConfig):
        self.tokenizer, self.golds, self.retrieve, self.cfg = tokenizer, [list(g) for g in golds], retrieve, cfg
        self.max_turns, self.action_len, self.obs_len = cfg.max_turns, cfg.action_len, cfg.obs_len
        encode = lambda text: tuple(tokenizer.encode(text, add_special_tokens=False))
        ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        self.stop_ids = tuple(sorted(i for i in ends if isinstance(i, int) and i != tokenizer.unk_token_id))
        # a tag's ids depend on what precedes it (BPE merges a leading space): stop on both forms
        self.stop_sequences = tuple(dict.fromkeys(encode(p + s) for s in STOP_STRINGS for p in ("", " ")))
        self._open, self._close = list(encode(INFO_OPEN)), list(encode(INFO_CLOSE))
        self._invalid = list(encode(INVALID_OBSERVATION))[: cfg.obs_len]
        self._room = cfg.obs_len - len(self._open) - len(self._close)
        if self._room < 1:
            raise ValueError(f"search_qa.obs_len={cfg.obs_len} leaves no room for passages between "
                             f"{INFO_OPEN!r} and {INFO_CLOSE!r} ({len(self._open) + len(self._close)} tokens)")

    def step(self, question: np.ndarray, turn: np.ndarray, live: np.ndarray, action: np.ndarray,
             action_len: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        s = len(question)
        obs, obs_len = np.zeros((s, self.obs_len), np.int32), np.zeros(s, np.int32)
        reward, done = np.zeros(s, np.float32), np.zeros(s, bool)
        slots = np.flatnonzero(live)
        texts = self.tokenizer.batch_decode([action[i, : action_len[i]].tolist() for i in slots],
                                            skip_special_tokens=True)
        actions = dict(zip(slots.tolist(), map(parse_action, texts)))
        last = {i: turn[i] + 1 >= self.max_turns for i in slots.tolist()}
        searching = [i for i, a in actions.items() if a.kind == "search" and not last[i]]
        hits = self.retrieve([actions[i].content for i in searching]) if searching else []
        passages = self.tokenizer([format_passages([h["document"] for h in hs]).strip() for hs in hits],
                                  add_special_tokens=False)["input_ids"] if hits else []
        found = dict(zip(searching, passages))
        for i, act in actions.items():
            if act.kind == "answer":
                reward[i], done[i] = exact_match(act.content, self.golds[question[i]]), True
            elif last[i]:
                done[i] = True  # out of turns without an answer: reward 0
            else:
                ids = (self._open + found[i][: self._room] + self._close) if i in found else self._invalid
                obs[i, : len(ids)], obs_len[i] = ids, len(ids)
        return obs, obs_len, reward, done
