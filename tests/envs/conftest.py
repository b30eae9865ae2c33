"""Shared HopWorld fixtures: one small world and one jitted step per session."""

import jax
import pytest

from trace_jax.envs.hopworld import jax_env
from trace_jax.envs.hopworld.config import HopWorldConfig
from trace_jax.envs.hopworld.world import World, build_world


@pytest.fixture(scope="session")
def cfg() -> HopWorldConfig:
    return HopWorldConfig(seed=3, num_entities=128, num_questions=400)


@pytest.fixture(scope="session")
def world(cfg: HopWorldConfig) -> World:
    return build_world(cfg)


@pytest.fixture(scope="session")
def device_world(world: World) -> World:
    return jax.device_put(world)


@pytest.fixture(scope="session")
def jit_step():
    return jax.jit(jax_env.step, static_argnums=1)


@pytest.fixture(scope="session")
def jit_reset():
    return jax.jit(jax_env.reset)
