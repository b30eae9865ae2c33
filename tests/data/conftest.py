"""Shared data fixtures: a small world config and its dataset built once per session."""

from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from trace_jax.data.hopworld_tfds import build_dataset
from trace_jax.envs.hopworld.config import HopWorldConfig
from trace_jax.envs.hopworld.world import World, build_world

tfds.disable_progress_bar()


@pytest.fixture(scope="session")
def small_cfg() -> HopWorldConfig:
    return HopWorldConfig(seed=0, num_entities=96, num_questions=200)


@pytest.fixture(scope="session")
def small_world(small_cfg) -> World:
    return build_world(small_cfg)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory, small_cfg) -> Path:
    path = tmp_path_factory.mktemp("tfds")
    build_dataset(path, small_cfg)
    return path
