"""The XLA flags of every process the tests run (this session, its subprocesses, the notebooks' kernels): compiling,
not running, dominates the suite's time on a CPU (the programs are tiny), so LLVM's optimisation level 0 and XLA:CPU's
older loop emitters, which compile a training step in about half the time of its fusion emitters. Processes whose
results are compared use the same flags, so they compile the same code."""

import os

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
DEVICE_COUNT = "--xla_force_host_platform_device_count"


def host_flags(devices: int) -> str:
    """XLA_FLAGS for a test process on `devices` host devices: FAST_COMPILE, then every flag of this process's
    XLA_FLAGS but its device count, last so that they win: `XLA_FLAGS=--xla_cpu_max_isa=AVX2 pytest` runs the
    session, its subprocesses and the notebooks' kernels as an AVX2 machine computes (docs/development.md)."""
    given = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT)]
    return " ".join(dict.fromkeys([f"{DEVICE_COUNT}={devices}", *FAST_COMPILE.split(), *given]))

# For the few programs the tests run many times (the fine-tuning loops that build the trained toy policy and the
# search QA kit): LLVM's optimisation level 1, one program's option (`jax.jit(compiler_options=...)`). A tiny
# Qwen3's fine-tuning step compiles in about the same time as at level 0 and runs in half the time.
RUN_FAST = {"xla_backend_optimization_level": 1}
