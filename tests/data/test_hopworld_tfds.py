"""TFDS HopWorld: array_record build, reload by name without TensorFlow, determinism, errors."""

import dataclasses
import sys

import pytest
import tensorflow_datasets as tfds

from trace_jax.data.hopworld_tfds import (
    SPLIT_FRACTIONS,
    build_dataset,
    config_name,
    read_split,
)
from trace_jax.envs.hopworld.config import HopWorldConfig


def _by_id(examples):
    return {int(ex["question_id"]): ex for ex in examples}


def test_no_tensorflow():
    assert "tensorflow" not in sys.modules


def test_reload_by_name_matches_world(data_dir, small_cfg, small_world):
    seen = []
    for split in SPLIT_FRACTIONS:
        name = f"hop_world/{config_name(small_cfg)}"
        source = tfds.data_source(name, data_dir=str(data_dir), split=split)
        for i in range(len(source)):
            ex = source[i]
            q = int(ex["question_id"])
            assert ex["question"].decode() == small_world.question_text(q)
            assert ex["answer"].decode() == small_world.answer_text(q)
            assert int(ex["hops"]) == small_world.hops[q]
            assert int(ex["world_seed"]) == small_cfg.seed
            seen.append(q)
    assert sorted(seen) == list(range(small_cfg.num_questions)), "splits partition the questions"
    assert len(read_split(data_dir, small_cfg, "train")) == int(0.8 * small_cfg.num_questions)


def test_registered_config_name():
    assert config_name(HopWorldConfig(seed=2)) == "seed_2"
    assert tfds.builder("hop_world/seed_2", data_dir="/unused").builder_config.seed == 2


def test_same_seed_same_examples_other_seed_differs(tmp_path, data_dir, small_cfg):
    build_dataset(tmp_path, small_cfg)
    original = _by_id(read_split(data_dir, small_cfg, "test"))
    assert _by_id(read_split(tmp_path, small_cfg, "test")) == original
    other = dataclasses.replace(small_cfg, seed=1)
    build_dataset(tmp_path, other)
    a, b = _by_id(read_split(tmp_path, other, "test")), original
    assert a.keys() == b.keys() and a != b


def test_missing_data_dir(tmp_path, small_cfg):
    with pytest.raises(FileNotFoundError, match="trace-jax data build"):
        read_split(tmp_path / "nowhere", small_cfg, "train")
    with pytest.raises(ValueError, match="unknown split"):
        read_split(tmp_path, small_cfg, "dev")


@pytest.mark.parametrize("damage", ["truncate_half", "truncate_tail", "delete"])
def test_corrupt_data_dir(tmp_path, small_cfg, damage):
    version_dir = build_dataset(tmp_path, small_cfg)
    (path,) = version_dir.glob("*-train.array_record-*")
    if damage == "delete":
        path.unlink()
    else:
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(size // 2 if damage == "truncate_half" else size - 10)
    with pytest.raises(ValueError, match="corrupt or incomplete.*trace-jax data build"):
        read_split(tmp_path, small_cfg, "train")
    assert len(read_split(tmp_path, small_cfg, "test")) == int(0.1 * small_cfg.num_questions)


def test_builds_worlds_with_more_hops_than_default_turns(tmp_path):
    """Questions of up to 6 hops need max_turns >= 7: the builder's world must not fall back to 6 turns."""
    cfg = HopWorldConfig(num_entities=64, num_questions=40, max_hops=6, max_turns=7)
    build_dataset(tmp_path, cfg)
    hops = {int(ex["hops"]) for split in SPLIT_FRACTIONS for ex in read_split(tmp_path, cfg, split)}
    assert max(hops) > 4
