"""`trace-jax compare`: methods (allocators and controls) x seeds at equal cost, from one base policy.

methods: what a comparison may vary (allocator fields and budgets) and the fairness check;
run: the runs and the shared per-seed predictor warm-up; summary: the table read from the raw metrics;
plots: the figures.
"""
