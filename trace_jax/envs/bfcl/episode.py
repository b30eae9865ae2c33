"""One BFCL multi-turn conversation at the text level (no tokens), as bfcl-eval's inference loop runs it and its
multi_turn_checker scores it.

A step is one assistant message. If it holds `<tool_call>` blocks, each is run on the episode's APIs and its result
comes back as a tool message; after more than bfcl's MAXIMUM_STEP_LIMIT such steps in one user turn the episode is
cut off (bfcl's force quit: it fails). A message without a block ends the user turn: the turn is checked, and the
next user turn follows (at a held-out turn, the message revealing its functions). A held-out function is left out of
the tools until its turn, and runs when called before it, as bfcl's inference loop runs it. The reward, at the end,
is 1 if every turn passed bfcl's checks against the ground truth, else 0; an episode ends at its first failed turn.

The checks, per turn with ground-truth calls (bfcl's `multi_turn_checker`): the turn made at least one call; the
instances equal the ground truth's after that turn (`state_checker`); every ground-truth result of the turn is among
the results of all the episode's calls so far (`response_checker`).

A message's calls are decoded as `decoding` says (`calls.decode_calls`): by default as bfcl's Qwen handler decodes
them (after the last `</think>`, its block pattern; a message whose blocks all fail to decode makes no call and ends
the user turn); `lenient` reads every block and answers a malformed one with an error result (not a call for the
checks), the turn going on.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

from trace_jax.envs.bfcl.apis import ERROR, Apis
from trace_jax.envs.bfcl.calls import Call, call_string, decode_calls
from trace_jax.envs.bfcl.chat import reveal_message
from trace_jax.envs.bfcl.data import Entry


@dataclasses.dataclass(frozen=True)
class Reference:
    """An entry's ground truth run turn by turn on its own APIs (every function offered: the ground truth is
    trusted): per turn its result strings and a copy of the instances after it. Read-only, shared by episodes."""

    results: tuple[tuple[str, ...], ...]
    instances: tuple[dict[str, Any], ...]


def reference(entry: Entry) -> Reference:
    """Run `entry`'s ground-truth call strings on fresh APIs, turn by turn."""
    apis, docs = Apis.of(entry), _docs(entry, len(entry.turns))
    results, states = [], []
    for calls in entry.ground_truth:
        results.append(tuple(apis.run_string(c, docs) for c in calls))
        states.append(copy.deepcopy(apis.instances))
    return Reference(tuple(results), tuple(states))


@dataclasses.dataclass
class Reply:
    """What follows an assistant message: messages (tool results, or the next user turn; [] when done), reward, done."""

    messages: list[dict[str, str]]
    reward: float
    done: bool


@dataclasses.dataclass
class Episode:
    """An entry's conversation in progress: its APIs' state and its place. A deep copy is an independent episode."""

    apis: Apis
    turn: int = 0  # the user turn being answered
    steps: int = 0  # steps with tool calls in this user turn
    calls: list[list[list[str]]] = dataclasses.field(default_factory=lambda: [[]])  # turn -> step -> call strings
    results: list[str] = dataclasses.field(default_factory=list)  # results of every call so far, in order
    failure: str | None = None  # the first failed check
    done: bool = False
    decoding: str = "bfcl"  # how a message's calls are read (`calls.decode_calls`)

    @classmethod
    def start(cls, entry: Entry, decoding: str = "bfcl") -> Episode:
        return cls(Apis.of(entry), decoding=decoding)

    def step(self, text: str, entry: Entry, ref: Reference) -> Reply:
        """One assistant message (its text) -> Reply. Never raises on any text (only when the episode is over)."""
        if self.done:
            raise RuntimeError(f"episode of {entry.id} is over; start a new one")
        parsed = decode_calls(text, self.decoding)
        return self._run(parsed, entry) if parsed else self._end_turn(entry, ref)

    def _run(self, parsed: list[Call | str], entry: Entry) -> Reply:
        docs, made, out = _docs(entry, len(entry.turns)), [], []  # as bfcl, which runs a held-out function
        for call in parsed:
            if isinstance(call, str):
                out.append(ERROR.format(call))
                continue
            result = self.apis.run(call, docs)
            made.append(call_string(call))
            self.results.append(result)
            out.append(result)
        if made:
            self.calls[self.turn].append(made)
        self.steps += 1
        if self.steps > MAXIMUM_STEP_LIMIT:
            return self.stop(f"turn {self.turn}: more than {MAXIMUM_STEP_LIMIT} steps of tool calls")
        return Reply([{"role": "tool", "content": r} for r in out], 0.0, False)

    def _end_turn(self, entry: Entry, ref: Reference) -> Reply:
        failure = self._check(entry, ref)
        self.turn, self.steps = self.turn + 1, 0
        if failure or self.turn == len(entry.turns):
            return self.stop(failure)
        self.calls.append([])
        return Reply(user_messages(entry, self.turn), 0.0, False)

    def _check(self, entry: Entry, ref: Reference) -> str | None:
        """bfcl's checks of the turn just ended: None if it passed, else bfcl's error message."""
        t = self.turn
        if not entry.ground_truth[t]:
            return None
        if not self.calls[t]:
            return f"Model response list is empty for turn {t}"
        state = state_checker(self.apis.instances, ref.instances[t])
        if not state["valid"]:
            return state["error_message"]
        response = response_checker(self.results, list(ref.results[t]), t)
        return None if response["valid"] else response["error_message"]

    def stop(self, failure: str | None) -> Reply:
        """End the episode: reward 1 if `failure` is None, else 0."""
        self.failure, self.done = failure, True
        return Reply([], float(failure is None), True)


def user_messages(entry: Entry, turn: int) -> list[dict[str, str]]:
    """The messages opening user turn `turn` (at a held-out turn: the message revealing its functions)."""
    return [reveal_message(entry.missed[turn])] if turn in entry.missed else [dict(m) for m in entry.turns[turn]]


def _docs(entry: Entry, turn: int) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in entry.functions_at(turn)}
