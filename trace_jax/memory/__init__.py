"""Per-chip memory of a training step: the analytic model (`terms`), the planner and the check before work (`plan`)."""

from trace_jax.memory.plan import CHIPS, HEADROOM, PRESETS, Chip, MemoryPlan, check_fits, plan_config, render

__all__ = ["CHIPS", "HEADROOM", "PRESETS", "Chip", "MemoryPlan", "check_fits", "plan_config", "render"]
