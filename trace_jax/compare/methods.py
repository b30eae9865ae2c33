"""Methods of a comparison: an allocator, its controls, and optional budgets; nothing else may differ.

A method name is a registered method, optionally with budgets: "trace", "grpo_matched",
"trace@32x6" (M = 32 root rollouts, N = 6 continuations per root).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trace_jax.config import TrainConfig, to_dict

# name -> TrainConfig fields it sets. Prefix-free methods get their M from equal_cost (see train.loop).
METHODS: dict[str, dict[str, Any]] = {
    "trace": {"allocator": "trace"},
    "grpo": {"allocator": "grpo"},
    "grpo_matched": {"allocator": "grpo", "match_group_size": True},  # group size = TRACE's leaves per prompt
    "pcl": {"allocator": "pcl"},
    "random_tree": {"allocator": "random_tree"},
    "uniform_tree": {"allocator": "uniform_tree"},  # at the same (M, N) as trace
    "trace_roots_uniform_prefix": {"allocator": "trace_roots_uniform_prefix"},
    "uniform_roots_trace_prefix": {"allocator": "uniform_roots_trace_prefix"},
}
METHOD_NOTES: dict[str, str] = {  # one line each, for a comparison's PROTOCOL.md
    "trace": "TRACE: prompts and turns chosen by the predictor's V~ (stage 1 roots, stage 2 continuations)",
    "grpo": "GRPO: prompts drawn uniformly, `group_size` rollouts each, M set by equal cost",
    "grpo_matched": "GRPO whose group size equals TRACE's mean leaves per opened prompt (measured at step 0)",
    "pcl": "GRPO's groups on the prompts whose V~ is nearest 0.5",
    "random_tree": "trees: GRPO's roots, continuations on anchors drawn at random, at TRACE's (M, N)",
    "uniform_tree": "trees: GRPO's roots, continuations spread evenly over anchors, at TRACE's (M, N)",
    "trace_roots_uniform_prefix": "TRACE's stage 1, stage 2 spread evenly",
    "uniform_roots_trace_prefix": "stage 1 spread evenly, TRACE's stage 2",
}
METHOD_FIELDS = ("allocator", "match_group_size", "roots", "continuations")  # what methods may differ in
RUN_FIELDS = ("out_dir", "checkpoint_dir")  # where each run writes
_BUDGET = re.compile(r"^(?P<name>[a-z_]+)@(?P<roots>\d+)x(?P<cont>\d+)$")


def method_fields(method: str) -> dict[str, Any]:
    """The TrainConfig fields `method` sets ("trace@32x6": also roots=32, continuations=6)."""
    match = _BUDGET.match(method)
    name = match["name"] if match else method
    if name not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {sorted(METHODS)}, optionally with budgets as "
                         "<method>@<M>x<N> (e.g. trace@32x6)")
    fields = dict(METHODS[name])
    if match:
        fields |= {"roots": int(match["roots"]), "continuations": int(match["cont"])}
    return fields


def method_config(base: TrainConfig, method: str, **run: Any) -> TrainConfig:
    """`base` with `method`'s fields and the per-run fields `run` (out_dir, seed, init_checkpoint, warmup)."""
    return dataclasses.replace(base, **method_fields(method), **run)


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, Mapping) else {f"{prefix}{k}": v}
    return out


def check_fair(configs: Mapping[str, TrainConfig]) -> None:
    """Raises unless the configs (method -> config, one seed) differ only in METHOD_FIELDS and RUN_FIELDS."""
    flat = {name: _flat(to_dict(cfg)) for name, cfg in configs.items()}
    names = list(flat)
    for other in names[1:]:
        diff = sorted(k for k in flat[names[0]] if flat[names[0]][k] != flat[other][k]
                      and k not in METHOD_FIELDS + RUN_FIELDS)
        if diff:
            raise ValueError(f"methods {names[0]!r} and {other!r} differ in {diff}, not only in the allocator and "
                             f"its budgets ({list(METHOD_FIELDS)}): the comparison would not be fair")


def parse_methods(methods: Sequence[str]) -> list[str]:
    """Validated, de-duplicated method names in order."""
    out = list(dict.fromkeys(m.strip() for m in methods if m.strip()))
    if not out:
        raise ValueError("a comparison needs at least one method")
    for m in out:
        method_fields(m)
    return out
