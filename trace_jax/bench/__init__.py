"""Benchmark commands (`trace-jax bench ...`): each prints ratios against a baseline run in the same process."""
