"""HopWorld: a pure-JAX synthetic multi-hop QA world with a search tool (Search-R1 protocol)."""

from trace_jax.envs.hopworld.config import HopWorldConfig
from trace_jax.envs.hopworld.world import World, build_world

__all__ = ["HopWorldConfig", "World", "build_world"]
