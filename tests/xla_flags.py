"""The XLA flags of every process the tests run (this session, its subprocesses, the notebooks' kernels): compiling,
not running, dominates the suite's time on a CPU (the programs are tiny), so LLVM's optimisation level 0 and XLA:CPU's
older loop emitters, which compile a training step in about half the time of its fusion emitters. Processes whose
results are compared use the same flags, so they compile the same code."""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"

# For the few programs the tests run many times (the fine-tuning loops that build the trained toy policy and the
# search QA kit): LLVM's optimisation level 1, one program's option (`jax.jit(compiler_options=...)`). A tiny
# Qwen3's fine-tuning step compiles in about the same time as at level 0 and runs in half the time.
RUN_FAST = {"xla_backend_optimization_level": 1}
