"""Typed configs: YAML + key=value overrides, and clear errors on bad keys or values."""

from pathlib import Path

import pytest

from trace_jax.config import SFTConfig, TrainConfig, load_config, parse_overrides


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 70\nworld:\n  seed: 3\n")
    cfg = load_config(SFTConfig, path, ["world.max_turns=7", "learning_rate=1e-4"])
    assert (cfg.steps, cfg.world.seed, cfg.world.max_turns, cfg.learning_rate) == (70, 3, 7, 1e-4)
    assert cfg.world.num_entities == SFTConfig().world.num_entities  # untouched default


def test_shipped_sft_config_equals_builtin_defaults():
    assert load_config(SFTConfig, "configs/hopworld_sft.yaml") == SFTConfig()


def test_unknown_key_names_key_and_allowed():
    with pytest.raises(ValueError, match=r"unknown config key 'world\.sede'.*allowed keys under world.*'seed'"):
        load_config(SFTConfig, None, ["world.sede=1"])


def test_wrong_type_and_bad_value_fail_by_name():
    with pytest.raises(ValueError, match=r"'steps': expected int, got 'many'"):
        load_config(SFTConfig, None, ["steps=many"])
    with pytest.raises(ValueError, match=r"sft\.mistake_prob must be in \[0, 1\]"):
        load_config(SFTConfig, None, ["mistake_prob=1.5"])
    with pytest.raises(ValueError, match="max_turns"):
        load_config(SFTConfig, None, ["world.max_turns=2"])


def test_bad_override_syntax_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["steps"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(SFTConfig, tmp_path / "nope.yaml")


def test_shipped_train_config_equals_builtin_defaults():
    assert load_config(TrainConfig, "configs/hopworld_trace.yaml") == TrainConfig()


@pytest.mark.parametrize("path", sorted(Path("configs").glob("*.yaml")))
def test_every_shipped_config_loads(path):
    from trace_jax.config import CompareConfig

    cls = SFTConfig if path.name == "hopworld_sft.yaml" else CompareConfig if "methods:" in path.read_text() \
        else TrainConfig
    load_config(cls, path)
