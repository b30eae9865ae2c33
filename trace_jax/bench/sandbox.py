"""`trace-jax bench sandbox`: programs per second through the math sandbox, on the tiny kit's typical programs.

Each round runs the same `programs` scripted solutions (`envs.math.problems`) through a `SandboxPool` (a fork,
lockdown and cleanup each) and, as the baseline, the same programs exec'd in this process with no isolation;
printed are the medians over rounds, their spread, and what isolation costs per program.
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import time

from trace_jax.envs.math.problems import generate
from trace_jax.envs.math.sandbox import SandboxConfig, SandboxPool


def _exec_all(codes: list[str]) -> None:
    for code in codes:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, "<cell>", "exec"), {"__name__": "__main__"})


def run_sandbox_bench(programs: int, workers: int, repeats: int) -> dict[str, float]:
    codes = [p.code for p in generate(programs, seed=0)]
    cfg = SandboxConfig(workers=workers)
    sandboxed, inline = [], []
    with SandboxPool(cfg) as pool:
        pool.run_many([[c] for c in codes[: pool.workers.size]])  # workers warm
        for _ in range(repeats):
            start = time.perf_counter()
            results = pool.run_many([[c] for c in codes])
            sandboxed.append(programs / (time.perf_counter() - start))
            failed = [r for r in results if r.status != "ok"]
            if failed:
                raise RuntimeError(f"a kit program failed in the sandbox: {failed[0]}")
            start = time.perf_counter()
            _exec_all(codes)
            inline.append(programs / (time.perf_counter() - start))
        size = pool.workers.size
    out = {"sandbox_programs_per_s": statistics.median(sandboxed), "inline_programs_per_s": statistics.median(inline),
           "workers": size, "cores": os.cpu_count() or 1}
    out["isolation_ms_per_program"] = 1e3 * size / out["sandbox_programs_per_s"] - 1e3 / out["inline_programs_per_s"]
    print(f"sandbox: {out['sandbox_programs_per_s']:.0f} programs/s (median of {repeats}; rounds "
          f"{min(sandboxed):.0f}-{max(sandboxed):.0f}) with {size} workers on {out['cores']} cores; in this process, "
          f"unisolated: {out['inline_programs_per_s']:.0f} programs/s; isolation costs "
          f"{out['isolation_ms_per_program']:.1f} ms a program per worker")
    return out


def run_math_step_bench(kit: str, steps: int, overrides: list[str]) -> dict[str, float]:
    """The host's share of a TRACE step on the math kit: the time in the environment's turns (sandbox and verifier
    calls, decoding, state) over the steps' wall time, steps 2..steps+1: the first (compilation) and the last (the
    run's final evaluation follows it) left out."""
    import tempfile
    from pathlib import Path

    from trace_jax.config import TrainConfig, load_config
    from trace_jax.envs.math.env import MathEnv
    from trace_jax.train.loop import train

    spent: list[float] = []
    step_seconds: dict[int, float] = {}
    timed = MathEnv.step

    def step(self, *args, **kwargs):  # the environment's share, summed per call
        start = time.perf_counter()
        try:
            return timed(self, *args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(TrainConfig, "configs/math_tiny.yaml", [
            f"task.policy_dir={Path(kit) / 'policy'}", f"task.problems_dir={Path(kit) / 'problems'}",
            f"out_dir={out}/run", f"data_dir={out}/tfds", f"steps={steps + 2}", f"eval_every={steps + 10}",
            f"checkpoint_every={steps + 10}", *overrides])
        marks: list[int] = []

        def on_log(s: int, row: dict[str, float]) -> None:
            step_seconds[s] = row.get("step_seconds", float("nan"))
            marks.append(len(spent))

        MathEnv.step = step
        try:
            train(cfg, on_log=on_log)
        finally:
            MathEnv.step = timed
    host = sum(spent[marks[1] : marks[steps + 1]])  # the calls between step 1's row and step steps+1's
    wall = sum(step_seconds[s] for s in range(2, steps + 2))
    out = {"host_seconds": host, "step_seconds": wall, "host_share": host / wall}
    print(f"math kit: the environment's turns (sandbox, verifier, decoding) take {host:.2f} s of {wall:.2f} s over "
          f"steps 2-{steps + 1}: {100 * out['host_share']:.1f}% of a step")
    return out
