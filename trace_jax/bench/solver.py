"""`trace-jax bench solver`: compile time, run time and memory of the exact allocation solvers.

Stage 1 (`root_counts`, an O(B M^2) DP) on a pool of B prompts with M root rollouts; stage 2
(`prefix_counts`) on those M roots' T = 4 anchors with N = 2 continuations per root, capped at
8 per anchor, grouped by the stage-1 counts. Absolute numbers on JAX's default device; memory is
XLA's estimate (temp + argument + output buffers) of the compiled program.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from trace_jax.solvers import prefix_counts, root_counts

TURNS, CONTINUATIONS, MAX_PER_ANCHOR = 4, 2, 8


def _memory_mib(compiled) -> float | None:
    """temp + argument + output MiB of a compiled program, None if the backend does not say."""
    try:
        stats = compiled.memory_analysis()
    except NotImplementedError:
        return None
    if stats is None:
        return None
    return (stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes) / 2**20


def time_solver(fn: Callable, args: Sequence[jax.Array], repeats: int) -> tuple[dict[str, float | None], object]:
    """(compile seconds, run seconds (median, min, max over `repeats` after a warm-up call) and MiB; output)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    out = jax.block_until_ready(compiled(*args))
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - start)
    return {"compile_s": compile_s, "median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs),
            "mib": _memory_mib(compiled)}, out


def stage2_inputs(m: np.ndarray, rng: np.random.Generator) -> tuple[jax.Array, ...]:
    """(q [M, T], valid [M, T], group [M], budget [B]) for the roots laid out by stage-1 counts m [B]."""
    num_roots = int(m.sum())
    q = rng.uniform(size=(num_roots, TURNS)).astype(np.float32)
    valid = rng.uniform(size=(num_roots, TURNS)) < 0.75
    group = np.repeat(np.arange(len(m)), m).astype(np.int32)
    return jnp.asarray(q), jnp.asarray(valid), jnp.asarray(group), jnp.asarray(m * CONTINUATIONS, jnp.int32)


def _print_row(name: str, b: int, num_roots: int, r: dict[str, float | None]) -> None:
    mib = "n/a" if r["mib"] is None else f"{r['mib']:.1f}"
    print(f"{name:>13} {b:>5} {num_roots:>5} {r['compile_s']:10.2f} {1e3 * r['median_s']:10.2f} "
          f"{1e3 * r['min_s']:9.2f} {1e3 * r['max_s']:9.2f} {mib:>8}")


def run_solver_bench(pool_sizes: Sequence[int] = (256, 512), roots: Sequence[int] = (512, 1024),
                     repeats: int = 5) -> None:
    device = jax.devices()[0]
    print(f"solvers on {device.platform} ({device.device_kind}); stage 2: T={TURNS} anchors per root, "
          f"N={CONTINUATIONS}, max_per_anchor={MAX_PER_ANCHOR}; times over {repeats} runs after a warm-up")
    print(f"{'solver':>13} {'B':>5} {'M':>5} {'compile s':>10} {'median ms':>10} {'min ms':>9} {'max ms':>9} "
          f"{'MiB':>8}")
    rng = np.random.default_rng(0)
    for b in pool_sizes:
        for num_roots in roots:
            v = jnp.asarray(rng.uniform(size=b).astype(np.float32))
            r, m = time_solver(functools.partial(root_counts, num_roots=num_roots), (v,), repeats)
            _print_row("root_counts", b, num_roots, r)
            stage2 = functools.partial(prefix_counts, max_per_anchor=MAX_PER_ANCHOR)
            stage2_times = time_solver(stage2, stage2_inputs(np.asarray(m), rng), repeats)[0]
            _print_row("prefix_counts", b, num_roots, stage2_times)

