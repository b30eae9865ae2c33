"""HF checkpoint import/export: round trips, sharded files, and clear errors on bad checkpoints."""

import dataclasses
import json
import re
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3ForCausalLM

from tiny_qwen3 import write_tiny_qwen3
from trace_jax.envs.search_qa.config import SearchQAConfig
from trace_jax.models import ModelConfig, Policy, with_predictor_layers
from trace_jax.models.hf_io import from_pretrained, save_pretrained


def _params(model) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_export_round_trip_is_bit_exact_and_loads_in_transformers(tiny_qwen3, tmp_path):
    hf_dir, _ = tiny_qwen3
    model = from_pretrained(hf_dir)
    # Give the success head non-trivial values so its file is really exercised.
    model.success_kernel[...] = jnp.linspace(-1, 1, model.cfg.hidden_size)
    model.success_bias[...] = jnp.asarray(0.25)
    out = save_pretrained(model, tmp_path / "export")
    again = from_pretrained(out)
    a, b = _params(model), _params(again)
    assert a.keys() == b.keys()
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=str(path))
    ref = Qwen3ForCausalLM.from_pretrained(out).eval()
    ids = np.random.RandomState(0).randint(0, model.cfg.vocab_size, (2, 10))
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    np.testing.assert_array_equal(np.asarray(model(jnp.asarray(ids)).logits),
                                  np.asarray(again(jnp.asarray(ids)).logits))
    assert np.abs(np.asarray(again(jnp.asarray(ids)).logits) - expected).max() <= 1e-4


def test_predictor_layers_round_trip_beside_the_hf_weights(tiny_qwen3, tmp_path):
    """The predictor's own layers go to the success head's file, not to HF's config or weights; loading the export
    gives them back (bit-exact, and their count from the file); transformers loads the policy alone."""
    hf_dir, _ = tiny_qwen3
    model = with_predictor_layers(from_pretrained(hf_dir), 1)
    model.predictor[0].mlp.up_proj[...] = 1.5 * model.predictor[0].mlp.up_proj[...]
    model.success_kernel[...] = jnp.linspace(-1, 1, model.cfg.hidden_size)
    out = save_pretrained(model, tmp_path / "export")
    assert "predictor" not in (out / "config.json").read_text()
    again = from_pretrained(out)
    assert again.cfg == model.cfg and again.cfg.predictor_layers == 1
    a, b = _params(model), _params(again)
    assert a.keys() == b.keys() and any(p[0] == "predictor" for p in a)
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=str(path))
    ids = jnp.asarray(np.random.RandomState(0).randint(0, model.cfg.vocab_size, (2, 10)))
    np.testing.assert_array_equal(np.asarray(model(ids).success), np.asarray(again(ids).success))
    ref = Qwen3ForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        expected = ref(torch.tensor(np.asarray(ids))).logits.numpy()
    assert np.abs(np.asarray(again(ids).logits) - expected).max() <= 1e-4


def test_sharded_safetensors_index_loads(tmp_path):
    ref = write_tiny_qwen3(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    model = from_pretrained(tmp_path / "sharded")
    ids = np.arange(12).reshape(2, 6)
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    assert np.abs(np.asarray(model(jnp.asarray(ids)).logits) - expected).max() <= 1e-4


def test_plain_hf_checkpoint_gets_a_neutral_success_head(tmp_path):
    write_tiny_qwen3(tmp_path / "hf")
    out = from_pretrained(tmp_path / "hf")(jnp.zeros((1, 3), jnp.int32))
    np.testing.assert_allclose(out.success, 0.5)


def test_model_config_round_trips_through_hf_dict():
    cfg = ModelConfig(vocab_size=11, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=8, tie_word_embeddings=True, rope_theta=5e5)
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


def test_jnp_dtype_loads_like_its_name(good_ckpt):
    by_name, by_dtype = from_pretrained(good_ckpt, dtype="bfloat16"), from_pretrained(good_ckpt, dtype=jnp.bfloat16)
    assert by_dtype.cfg == by_name.cfg and by_dtype.cfg.param_dtype == by_dtype.cfg.dtype == "bfloat16"
    a, b = _params(by_name), _params(by_dtype)
    assert a.keys() == b.keys()
    for path in a:
        assert b[path].dtype == a[path].dtype == (jnp.float32 if path[0].startswith("success") else jnp.bfloat16)
        np.testing.assert_array_equal(a[path], b[path], err_msg=str(path))


SMALL = ModelConfig(vocab_size=11, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                    head_dim=8)


def test_model_config_dtypes_are_stored_by_name():
    spellings = ["bfloat16", jnp.bfloat16, np.dtype(jnp.bfloat16), jnp.dtype("bfloat16")]
    configs = [dataclasses.replace(SMALL, param_dtype=d, dtype=d) for d in spellings]
    configs.append(SMALL.with_dtype(jnp.bfloat16))
    assert all(c == configs[0] and hash(c) == hash(configs[0]) for c in configs)
    assert configs[1].param_dtype == configs[1].dtype == "bfloat16" and configs[1].jnp_dtype == jnp.bfloat16
    assert dataclasses.replace(SMALL, dtype=np.float32) == SMALL and SMALL.dtype == "float32"
    assert json.loads(json.dumps(dataclasses.asdict(configs[1])))["param_dtype"] == "bfloat16"


@pytest.mark.parametrize("bad", [jnp.int32, "fp8", "bf16", np.float64])
def test_unknown_dtype_is_refused_by_name(tmp_path, bad):
    allowed = r"\['bfloat16', 'float16', 'float32'\]"
    with pytest.raises(ValueError, match=rf"param_dtype={re.escape(repr(bad))} is not a supported dtype.*{allowed}"):
        dataclasses.replace(SMALL, param_dtype=bad)
    with pytest.raises(ValueError, match=rf"with_dtype: dtype={re.escape(repr(bad))}.*{allowed}"):
        SMALL.with_dtype(bad)
    with pytest.raises(ValueError, match=rf"from_pretrained: dtype={re.escape(repr(bad))}.*{allowed}"):
        from_pretrained(tmp_path / "not-read", dtype=bad)  # refused before any file is read
    with pytest.raises(ValueError, match=rf"from_pretrained: compute_dtype={re.escape(repr(bad))}.*{allowed}"):
        from_pretrained(tmp_path / "not-read", compute_dtype=bad)
    with pytest.raises(ValueError, match=rf"search_qa.dtype={re.escape(repr(bad))}.*{allowed}"):
        SearchQAConfig(dtype=bad)


@pytest.fixture
def good_ckpt(tmp_path):
    write_tiny_qwen3(tmp_path / "good")
    return tmp_path / "good"


def test_missing_config_is_named(good_ckpt):
    (good_ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(good_ckpt)


def test_missing_weights_are_named(good_ckpt):
    (good_ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_pretrained(good_ckpt)


def test_other_architecture_is_rejected(good_ckpt):
    cfg = json.loads((good_ckpt / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "llama", ["LlamaForCausalLM"]
    (good_ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="only Qwen3.*llama|llama.*only Qwen3"):
        from_pretrained(good_ckpt)


def test_wrong_shape_names_the_tensor(good_ckpt):
    cfg = json.loads((good_ckpt / "config.json").read_text())
    cfg["intermediate_size"] += 8
    (good_ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mlp\.(gate|up|down)_proj\.weight.*shape"):
        from_pretrained(good_ckpt)


def test_missing_tensor_is_named(good_ckpt):
    cfg = json.loads((good_ckpt / "config.json").read_text())
    cfg["num_hidden_layers"] += 1
    (good_ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KeyError, match=r"model\.layers\.2\..*missing"):
        from_pretrained(good_ckpt)


def test_truncated_file_is_named(good_ckpt):
    path = good_ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors.*(truncated|corrupt)"):
        from_pretrained(good_ckpt)


def test_missing_shard_is_named(tmp_path):
    write_tiny_qwen3(tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (tmp_path / "sharded" / victim).unlink()
    with pytest.raises(FileNotFoundError, match=victim):
        from_pretrained(tmp_path / "sharded")


def test_unexpected_tensors_are_reported(good_ckpt, tmp_path):
    cfg = json.loads((good_ckpt / "config.json").read_text())
    cfg["tie_word_embeddings"] = True  # the checkpoint still carries lm_head.weight
    (good_ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lm_head.weight"):
        from_pretrained(good_ckpt)


def test_random_init_export_loads_in_transformers(tmp_path):
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, tie_word_embeddings=True, rope_theta=1e4)
    model = Policy(cfg, nnx.Rngs(0))
    save_pretrained(model, tmp_path / "x")
    ref = Qwen3ForCausalLM.from_pretrained(tmp_path / "x").eval()
    ids = np.arange(10).reshape(1, 10)
    with torch.no_grad():
        expected = ref(torch.tensor(ids)).logits.numpy()
    assert np.abs(np.asarray(model(jnp.asarray(ids)).logits) - expected).max() <= 1e-4
    shutil.rmtree(tmp_path / "x")

