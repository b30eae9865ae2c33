"""`trace-jax compare`'s config: the shared TrainConfig, the methods, the seeds. It lives beside the methods it
checks (`trace_jax.config` holds the configs the package imports everywhere and imports nothing of compare)."""

from __future__ import annotations

import dataclasses

from trace_jax.compare.methods import parse_methods
from trace_jax.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """`trace-jax compare`: each method trained with each seed from one base policy, at equal cost.

    Methods: see `trace_jax.compare.methods` (allocators, the grpo_matched control, "<method>@<M>x<N>").
    Run k uses seed train.seed + k for every method: the same prompts, warm-up and evaluation keys.
    """

    train: TrainConfig = TrainConfig()  # the settings every method shares (its allocator fields are set per method)
    # allocators and controls, e.g. trace, grpo, grpo_matched, trace@32x6
    methods: tuple[str, ...] = ("trace", "grpo", "grpo_matched", "uniform_tree", "random_tree", "pcl")
    seeds: int = 3  # runs per method, seeds train.seed, train.seed + 1, ...
    out_dir: str = "runs/compare"  # runs/<method>/seed<s>, summary.json, results.md, PNGs

    def __post_init__(self) -> None:
        if not self.seeds > 0:
            raise ValueError(f"compare.seeds must be positive, got {self.seeds}")
        parse_methods(self.methods)
