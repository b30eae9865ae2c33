"""`trace-jax compare`: several allocators, same base policy, seed and cost, one table and one plot."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trace_jax.config import TrainConfig
from trace_jax.metrics import compare_runs, read_metrics
from trace_jax.train.loop import train

COMPARE_KEYS = ("reward", "effective_ratio", "eval/success", "generated_tokens")


def summarize(rows: list[dict]) -> dict[str, float]:
    """Means over training steps, and test success at the first and last evaluation."""
    steps = [r for r in rows if r["step"] > 0]
    evals = [r for r in rows if r.get("eval/success") is not None]

    def mean(key: str) -> float:
        return float(np.mean([r[key] for r in steps if r.get(key) is not None]))

    return {"reward": mean("reward"), "effective_ratio": mean("effective_ratio"),
            "generated_tokens": mean("generated_tokens"), "leaves": mean("leaves"),
            "eval_start": evals[0]["eval/success"], "eval_end": evals[-1]["eval/success"]}


def compare(cfg: TrainConfig, allocators: Sequence[str]) -> dict[str, dict[str, float]]:
    """Train each allocator into cfg.out_dir/<name>; print a table; plot them together."""
    root = Path(cfg.out_dir)
    runs = {}
    for name in allocators:
        train(dataclasses.replace(cfg, allocator=name, out_dir=str(root / name)))
        runs[name] = root / name
    table = {name: summarize(read_metrics(path)) for name, path in runs.items()}
    print(f"\n{'allocator':>28} {'reward':>7} {'eff. ratio':>10} {'tokens/step':>12} {'leaves':>7} "
          f"{'test before':>12} {'test after':>11}")
    for name, s in table.items():
        print(f"{name:>28} {s['reward']:7.3f} {s['effective_ratio']:10.3f} {s['generated_tokens']:12.0f} "
              f"{s['leaves']:7.1f} {100 * s['eval_start']:11.1f}% {100 * s['eval_end']:10.1f}%")
    plot = compare_runs(runs, COMPARE_KEYS, root / "compare.png")
    print(f"compare: runs under {root}, plot {plot}")
    return table
