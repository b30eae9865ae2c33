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
    from trace_jax.compare.config import CompareConfig

    cls = SFTConfig if path.name == "hopworld_sft.yaml" else CompareConfig if "methods:" in path.read_text() \
        else TrainConfig
    load_config(cls, path)


@pytest.mark.parametrize("override, message", [
    ("max_grad_norm=-1", r"train\.max_grad_norm must be positive, got -1"),  # optax would ascend the gradient
    ("max_grad_norm=0", r"train\.max_grad_norm must be positive"),  # every update zeroed
    ("temperature=.nan", r"train\.temperature must be positive, got nan"),
    ("kl_coef=-0.1", r"train\.kl_coef must be >= 0"),
    ("predictor_coef=-1", r"train\.predictor_coef must be >= 0"),
    ("seed=-1", r"train\.seed must be >= 0"),
    ("world.seed=-1", r"world\.seed must be >= 0"),
    ("sft.seed=-1", r"sft\.seed must be >= 0"),
    ("sft.batch_size=64", r"sft\.batch_size=64 exceeds sft\.episodes=32"),
    ("sft.eval_temperature=-1", r"sft\.eval_temperature must be >= 0"),  # 0 is greedy: loads (below)
    ("pack_len=64", r"pack_len needs pack_rows > 0"),  # auto packs on a CPU only: elsewhere it would fail late
    ("warmup.held_out=1", r"warmup\.held_out=1\.0 must lie strictly between 0 and 1"),  # nothing left to fit
    ("warmup.group_size=1", r"16 warm-up prompts exceeds pool_size=8: raise warmup\.group_size or pool_size"),
    ("roots=32 warmup.group_size=4 max_roots_per_prompt=2",
     r"pool_size=8 prompts x max_roots_per_prompt=2 cannot take train\.roots=32"),
    ("search_qa.retriever.cache_dir=5", r"'search_qa\.retriever\.cache_dir': expected str, got 5"),
    ("out_dir=@x", r"override 'out_dir=@x': '@x' is not a valid YAML value"),
    ("roots=[1,", r"override 'roots=\[1,': '\[1,' is not a valid YAML value"),
])
def test_values_that_would_fail_late_or_train_wrongly_fail_at_load(override, message):
    """Each fails when the config loads, naming the field, not after SFT, warm-up or the first step."""
    base = ["pool_size=8", "sft.episodes=32"]
    with pytest.raises(ValueError, match=message):
        load_config(TrainConfig, None, [*base, *override.split()])
    assert load_config(TrainConfig, None, [*base, "sft.eval_temperature=0"]).sft.eval_temperature == 0  # base loads
    assert load_config(TrainConfig, None, ["search_qa.retriever.cache_dir=/tmp/c"]).search_qa.retriever.cache_dir \
        == "/tmp/c"


def test_compare_takes_every_family_and_their_task_sections():
    from trace_jax.compare.config import CompareConfig

    assert load_config(CompareConfig, None, ["train.env=search_qa"]).train.env == "search_qa"
    cfg = load_config(CompareConfig, None, ["train.env=counter_family:FAMILY", "train.task.max_turns=3"])
    assert cfg.train.task == {"max_turns": 3}
    with pytest.raises(ValueError, match="config key 'train.task': expected dict"):
        load_config(CompareConfig, None, ["train.task=3"])
