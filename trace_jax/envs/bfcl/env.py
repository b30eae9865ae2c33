"""BFCL v4 multi-turn function calling as a stateful `HostEnv`, token in, token out.

A policy turn is one assistant message (it ends at the end-of-message token). Its text is run by the episode logic
(`episode.Episode`): tool calls are executed on the episode's own API instances and their results come back, and a
message without calls moves to the next user turn. Observations are the chat template's text between that message
and the next assistant message, tokenised: the tool results (or the next user turn) and the generation prompt. The
terminal reward is bfcl's verdict on the whole conversation (1 or 0).

Stateful (`HostEnv.stateful`): the state is the `Episode` (the APIs' instances and the place in the conversation),
kept per (question, actions so far) by `StatefulHostEnv` as deep copies; a fork mid-episode restores its anchor's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from trace_jax.envs.bfcl.apis import ERROR
from trace_jax.envs.bfcl.chat import END_OF_MESSAGE, continuation_text, prompt_text
from trace_jax.envs.bfcl.data import Entry
from trace_jax.envs.bfcl.episode import Episode, Reference, reference, user_messages
from trace_jax.envs.stateful import StatefulHostEnv

TRUNCATED = " ...[truncated]"  # ends a tool result or user message shortened to fit obs_len


class BfclEnv(StatefulHostEnv):
    """Batched over slots; question ids index `entries`. A question's ground truth is run once, when first met."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, entries: Sequence[Entry], max_turns: int, action_len: int,
                 obs_len: int, cache_size: int = 4096, decoding: str = "bfcl"):
        super().__init__(cache_size)
        self.decoding = decoding  # how a message's calls are read (`calls.decode_calls`)
        self.tokenizer, self.entries = tokenizer, list(entries)
        self.max_turns, self.action_len, self.obs_len = max_turns, action_len, obs_len
        ends = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(END_OF_MESSAGE)}
        self.stop_ids = tuple(sorted(i for i in ends if isinstance(i, int) and i != tokenizer.unk_token_id))
        self._references: dict[int, Reference] = {}
        self._tail = self._encode(continuation_text(tokenizer, []), closed=False)  # end of message + generation prompt
        if len(self._tail) >= obs_len:
            raise ValueError(f"bfcl obs_len={obs_len} leaves no room for an observation: the chat template's end of "
                             f"message and generation prompt alone take {len(self._tail)} tokens")

    def prompt_ids(self, question: int) -> list[int]:
        """The chat prompt of a question: its first user turn and its tools, through the tokenizer's template."""
        entry = self.entries[question]
        text = prompt_text(self.tokenizer, user_messages(entry, 0), entry.functions)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def reference(self, question: int) -> Reference:
        if question not in self._references:
            self._references[question] = reference(self.entries[question])
        return self._references[question]

    # StatefulHostEnv: the state is the episode
    def fresh(self, question: int) -> Episode:
        return Episode.start(self.entries[question], self.decoding)

    def act(self, state: Episode, question: int, turn: int, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        ids = [int(a) for a in action]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reply = state.step(text, self.entries[question], self.reference(question))
        if not reply.done and turn + 1 >= self.max_turns:  # out of turns mid-conversation: bfcl's force quit
            state.stop(f"cut off after max_turns={self.max_turns} messages")
            return np.zeros(0, np.int32), 0.0, True
        if reply.done:
            return np.zeros(0, np.int32), reply.reward, True
        closed = bool(ids) and ids[-1] in self.stop_ids
        return np.asarray(self._observation(reply.messages, closed), np.int32), 0.0, False

    def error_observation(self, exc: Exception) -> np.ndarray:
        message = {"role": "tool", "content": ERROR.format(f"environment error ({type(exc).__name__})")}
        return np.asarray(self._observation([message], closed=True), np.int32)

    def _encode(self, text: str, closed: bool) -> list[int]:
        """Tokens of a continuation; its end-of-message is left out when the action already ended with one."""
        if closed and text.startswith(END_OF_MESSAGE):
            text = text[len(END_OF_MESSAGE):]
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _observation(self, messages: list[dict[str, str]], closed: bool) -> list[int]:
        """The continuation's tokens, at most obs_len: message contents shortened to equal shares if need be, and
        if the wrapping alone is too long, its head and the generation prompt."""
        ids = self._encode(continuation_text(self.tokenizer, messages), closed)
        if len(ids) <= self.obs_len:
            return ids
        bare = self._encode(continuation_text(self.tokenizer, [m | {"content": ""} for m in messages]), closed)
        share = max((self.obs_len - len(bare)) // len(messages), 0)
        short = [m | {"content": self._clip(m["content"], share)} for m in messages]
        ids = self._encode(continuation_text(self.tokenizer, short), closed)
        if len(ids) > self.obs_len:
            ids = ids[: self.obs_len - len(self._tail)] + self._tail
        return ids

    def _clip(self, content: str, tokens: int) -> str:
        ids = self.tokenizer.encode(content, add_special_tokens=False)
        if len(ids) <= tokens:
            return content
        keep = max(tokens - len(self.tokenizer.encode(TRUNCATED, add_special_tokens=False)), 0)
        return self.tokenizer.decode(ids[:keep]) + TRUNCATED
