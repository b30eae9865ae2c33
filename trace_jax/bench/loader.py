"""`trace-jax bench loader`: the HopWorld prompt loader (`data/loader.py`) against a grain pipeline on the same data.

Both give one process's rows of pool `step` [B, P] as a pure function of (seed, step), from the same built
array_record split. The loader reads and tokenizes the split once, then indexes numpy arrays. grain reads each
record when asked (`MapDataset`: tfds array_record source -> per-epoch shuffle -> tokenize), random access by
step * B + row. Timed back to back: construction, then batches per second over consecutive steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from trace_jax.data.hopworld_tfds import build_dataset, hopworld_source
from trace_jax.data.loader import hopworld_loader
from trace_jax.envs.hopworld import HopWorldConfig, protocol, vocab

Batches = Callable[[int], np.ndarray]  # step -> prompt_ids [rows, P]


def grain_batches(data_dir: str, cfg: HopWorldConfig, batch_size: int, seed: int, rows: np.ndarray) -> Batches:
    """Rows `rows` of each batch of B prompts, read through grain on demand."""
    import grain

    def tokens(example) -> np.ndarray:
        question = example["question"]
        text = question.decode() if isinstance(question, bytes) else question
        return protocol.pad_rows([protocol.prompt_ids(vocab.encode(text))], cfg.prompt_len)[0][0]

    records = grain.MapDataset.source(hopworld_source(data_dir, cfg, "train")).shuffle(seed=seed).repeat()
    records = records.map(tokens)
    return lambda step: np.stack([records[step * batch_size + int(r)] for r in rows])


def _rate(batches: Batches, steps: int) -> float:
    """Batches per second over steps 0 .. steps-1."""
    start = time.perf_counter()
    for step in range(steps):
        batches(step)
    return steps / (time.perf_counter() - start)


def run_loader_bench(data_dir: str, world: HopWorldConfig, batch_size: int, processes: int, steps: int,
                     seed: int = 0) -> dict[str, float]:
    """Prints and returns construction seconds and batches/s of both, for process 0 of `processes` (its B/P rows)."""
    build_dataset(data_dir, world)
    rows = np.arange(batch_size // processes)
    start = time.perf_counter()
    loader = hopworld_loader(data_dir, world, "train", batch_size, seed)
    built = {"loader_build_s": time.perf_counter() - start}
    start = time.perf_counter()
    grain_rows = grain_batches(data_dir, world, batch_size, seed, rows)
    built["grain_build_s"] = time.perf_counter() - start
    out = built | {"loader_batches_per_s": _rate(lambda step: loader.batch(step, rows)["prompt_ids"], steps),
                   "grain_batches_per_s": _rate(grain_rows, steps)}
    out["loader_over_grain"] = out["loader_batches_per_s"] / out["grain_batches_per_s"]
    print(f"bench loader: {len(loader)} train prompts, B={batch_size}, {len(rows)} rows per process "
          f"({processes} processes), {steps} steps")
    print(f"  build:   loader {out['loader_build_s']:.3f} s, grain {out['grain_build_s']:.3f} s")
    print(f"  batches: loader {out['loader_batches_per_s']:.1f}/s, grain {out['grain_batches_per_s']:.1f}/s "
          f"(loader / grain = {out['loader_over_grain']:.1f}x)")
    return out
