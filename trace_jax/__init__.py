"""trace-jax: TRACE rollout budget allocation for multi-turn agentic RL, in JAX."""

__version__ = "0.1.0"
