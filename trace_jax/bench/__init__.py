"""Benchmark commands (`trace-jax bench ...`): several timed runs after a warm-up, median and spread;
comparisons run both sides back to back in the same process."""
