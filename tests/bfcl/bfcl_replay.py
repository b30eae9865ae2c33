"""Test helpers: an entry's ground truth as assistant messages, run through the episode logic, and bfcl-eval's own
multi_turn_checker on the same calls (its instances live in its module globals: removed after each use)."""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator
from typing import Any

from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

from trace_jax.envs.bfcl.apis import Apis
from trace_jax.envs.bfcl.calls import tool_call_text
from trace_jax.envs.bfcl.data import Entry
from trace_jax.envs.bfcl.episode import Episode, Reference, reference

DONE = "All done."  # a message without tool calls: ends the user turn
_probes = itertools.count()


def plan(entry: Entry, per_step: bool = False) -> list[list[list[str]]]:
    """The ground truth's call strings per turn per step: all of a turn's calls in one step, or one per step (past
    bfcl's step limit, the rest together in its last step: a step beyond the limit force-quits)."""
    if not per_step:
        return [[list(calls)] if calls else [] for calls in entry.ground_truth]
    n = MAXIMUM_STEP_LIMIT - 1
    return [[[c] for c in calls[:n]] + ([list(calls[n:])] if calls[n:] else []) for calls in entry.ground_truth]


def messages(entry: Entry, steps: list[list[list[str]]]) -> list[str]:
    """The assistant messages making `steps` (turn -> step -> call strings), each turn closed by DONE."""
    binder = Apis.of(entry)
    out = []
    for turn in steps:
        out += [tool_call_text([binder.bind(c) for c in step]) for step in turn if step] + [DONE]
    return out


def run(entry: Entry, texts: list[str], ref: Reference | None = None) -> tuple[Episode, float]:
    """The episode after `texts` (stopping when it is done) and its final reward (0.0 if not done)."""
    ref = ref or reference(entry)
    episode, reward = Episode.start(entry), 0.0
    for text in texts:
        reply = episode.step(text, entry, ref)
        if reply.done:
            reward = reply.reward
            break
    return episode, reward


def bfcl_valid(entry: Entry, steps: list[list[list[str]]]) -> bool:
    """bfcl's multi_turn_checker verdict on `steps` (the decoded model result: turn -> step -> call strings)."""
    test_entry = {"id": entry.id, "initial_config": entry.initial_config,
                  "involved_classes": list(entry.involved_classes)}
    decoded = [[step for step in turn if step] for turn in steps]
    with _bfcl_globals() as name:
        return multi_turn_checker(decoded, [list(t) for t in entry.ground_truth], test_entry,
                                  f"multi_turn_{entry.subset}", name)["valid"]


def bfcl_results(entry: Entry) -> list[list[str]]:
    """bfcl's execute_multi_turn_func_call of the ground truth, turn after turn on the same instances."""
    with _bfcl_globals() as name:
        return [execute_multi_turn_func_call(list(calls), entry.initial_config, list(entry.involved_classes), name,
                                             entry.id, long_context=entry.long_context)[0]
                for calls in entry.ground_truth]


@contextlib.contextmanager
def _bfcl_globals() -> Iterator[str]:
    """A model name of its own for bfcl's module-global instances, and those instances removed afterwards."""
    name = f"trace_jax_probe_{next(_probes)}"
    try:
        yield name
    finally:
        for key in [k for k in vars(multi_turn_utils) if k.startswith(name)]:
            delattr(multi_turn_utils, key)


def public_state(instances: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A copy of each instance's public attributes (what bfcl's state_checker compares)."""
    return {name: {k: copy.deepcopy(v) for k, v in vars(i).items() if not k.startswith("_")}
            for name, i in instances.items()}
