"""A success predictor with layers of its own (`ModelConfig.predictor_layers`): what it computes, checked against a
plain decoder built from the same weights; its cache rows; where its gradient goes; its optimizer group."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trace_jax.models import KVCache, ModelConfig, Policy, with_predictor_layers
from trace_jax.models.decode import decode_step, prefill
from trace_jax.models.jit import jit_with_model
from trace_jax.train.step import param_groups
from float32 import assert_float32_close, tree_scale

CFG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2,
                  head_dim=8, rope_theta=1e4)
forward = jit_with_model(Policy.__call__, static_argnames=("remat", "predictor_grad"))
prefill_jit = jit_with_model(prefill, static_argnames=("max_len",))
decode_jit = jit_with_model(decode_step)


def _ids(shape, seed=0) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), shape, 0, CFG.vocab_size)


def grown(layers: int = 1) -> Policy:
    """A random policy with `layers` predictor layers, moved off their copy of the top layers and a nonzero head
    (so that reading the policy's top layers, or its cache rows, instead of the predictor's would show)."""
    model = with_predictor_layers(Policy(CFG, nnx.Rngs(0)), layers)
    keys = iter(jax.random.split(jax.random.key(7), 64))
    for _, var in nnx.to_flat_state(nnx.state(model.predictor, nnx.Param)):
        var[...] = var[...] + 0.05 * jax.random.normal(next(keys), var[...].shape)
    model.success_kernel[...] = jax.random.normal(next(keys), (CFG.hidden_size,))
    model.success_bias[...] = jnp.asarray(-0.2)
    return model


def test_grown_predictor_starts_as_a_copy_of_the_top_layers():
    """The policy is untouched (bit-identical logits, its parameters shared), the predictor's hidden state is the
    policy's (its layers are copies of the top ones over the same input), and V~ = 0.5 (the head at zero)."""
    base = Policy(CFG, nnx.Rngs(0))
    model = with_predictor_layers(base, 2)
    assert model.cfg.predictor_layers == 2 and model.cfg.cache_layers == 5 and len(model.predictor) == 2
    ids = _ids((2, 9))
    a, b = forward(base, ids), forward(model, ids)
    np.testing.assert_array_equal(a.logits, b.logits)
    np.testing.assert_allclose(b.predictor_hidden, b.hidden, atol=1e-6)
    np.testing.assert_array_equal(b.success, 0.5)
    assert model.layers[2].mlp.up_proj is base.layers[2].mlp.up_proj  # shared, not copied
    assert with_predictor_layers(model, 2) is model
    with pytest.raises(ValueError, match="already has 2 predictor layers"):
        with_predictor_layers(model, 1)
    with pytest.raises(ValueError, match="predictor_layers must be in"):
        dataclasses.replace(CFG, predictor_layers=4)


@pytest.mark.parametrize("layers", [1, 2])
def test_predictor_is_a_decoder_over_the_layers_below(layers):
    """Independent reference: a plain policy (no predictor layers) whose top layers and final norm are the
    predictor's: its final hidden state is the predictor's, and V~ is the head on it."""
    model = grown(layers)
    plain = Policy(CFG, nnx.Rngs(1))
    below = CFG.num_layers - layers
    plain.embed_tokens = model.embed_tokens
    plain.layers = nnx.List(list(model.layers)[:below] + list(model.predictor))
    plain.norm = model.predictor_norm
    ids = _ids((3, 11), seed=1)
    out, ref = forward(model, ids), forward(plain, ids)
    np.testing.assert_allclose(out.predictor_hidden, ref.hidden, atol=1e-5)
    expected = jax.nn.sigmoid(ref.hidden @ model.success_kernel[...] + model.success_bias[...])
    np.testing.assert_allclose(out.success, expected, atol=1e-5)
    assert float(jnp.abs(out.predictor_hidden - out.hidden).max()) > 0.01  # the two reads really differ


def test_cached_decode_uses_the_predictors_own_cache_rows():
    """Prefill of rows of different prompt lengths, then decode steps: V~ and logits at every position are the full
    forward's."""
    model = grown(1)
    ids = np.asarray(_ids((3, 12), seed=2))
    full = forward(model, jnp.asarray(ids))
    lengths = np.array([4, 7, 2], np.int32)
    padded = np.where(np.arange(12)[None] < lengths[:, None], ids, 0)
    pre = prefill_jit(model, jnp.asarray(padded), jnp.asarray(lengths), max_len=16)
    assert len(pre.cache.k) == CFG.num_layers + 1
    rows = np.arange(3)
    np.testing.assert_allclose(pre.success, full.success[rows, lengths - 1], atol=1e-5)
    cache = pre.cache
    for step in range(12 - lengths.max()):
        pos = lengths + step
        out = decode_jit(model, jnp.asarray(ids[rows, pos]), cache)
        cache = out.cache
        np.testing.assert_allclose(out.success[:, 0], full.success[rows, pos], atol=1e-5)
        np.testing.assert_allclose(out.logits[:, 0], full.logits[rows, pos], atol=1e-4)
    empty = KVCache.init(model.cfg, 3, 16)
    assert len(empty.k) == len(empty.v) == CFG.num_layers + 1


def _grads(model: Policy, ids: jax.Array, remat: bool, predictor_grad: bool) -> dict:
    graphdef, params = nnx.split(model)

    def loss(p):
        return jnp.mean(nnx.merge(graphdef, p)(ids, remat=remat, predictor_grad=predictor_grad).success)

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    return value, {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(grads)}


def test_predictor_gradient_stops_at_its_input_unless_asked():
    """V~'s gradient reaches the predictor's layers and head always; the layers below it only with predictor_grad;
    never the policy's top layer, norm or output head (V~ does not read them). remat gives the same values."""
    model = grown(1)
    ids = _ids((2, 10), seed=3)
    value, frozen = _grads(model, ids, remat=False, predictor_grad=False)
    value_r, frozen_r = _grads(model, ids, remat=True, predictor_grad=False)
    np.testing.assert_allclose(value, value_r, rtol=1e-6)
    _, through = _grads(model, ids, remat=False, predictor_grad=True)
    _, through_r = _grads(model, ids, remat=True, predictor_grad=True)
    for name in frozen:  # remat reorders the sums, whose terms are of the whole gradient's size
        assert_float32_close(frozen_r[name], frozen[name], scale=tree_scale(frozen), err_msg=name)
        assert_float32_close(through_r[name], through[name], scale=tree_scale(through), err_msg=name)
        own = "predictor" in name or "success" in name
        below = any(f"'layers'][{i}]" in name for i in range(CFG.num_layers - 1)) or "embed_tokens" in name
        assert (np.abs(frozen[name]).max() > 0) == own, name
        assert (np.abs(through[name]).max() > 0) == (own or below), name


def test_predictor_layers_train_in_the_heads_optimizer_group():
    labels = param_groups(nnx.state(grown(1), nnx.Param))
    for path, label in jax.tree_util.tree_leaves_with_path(labels):
        name = jax.tree_util.keystr(path)
        assert label == ("head" if "predictor" in name or "success" in name else "policy"), name


def test_a_checkpoint_restores_the_predictors_layers(tmp_path):
    """`save_model` / `load_model` (a run's final policy, `trace-jax evaluate` and `export` read it): the config
    with its predictor layers and every parameter come back."""
    from trace_jax.checkpoints import load_model, save_model

    model = grown(2)
    save_model(tmp_path / "policy", 3, model)
    again = load_model(tmp_path / "policy")
    assert again.cfg == model.cfg and again.cfg.predictor_layers == 2
    a, b = (nnx.to_flat_state(nnx.state(m, nnx.Param)) for m in (model, again))
    for (path, x), (_, y) in zip(a, b, strict=True):
        np.testing.assert_array_equal(x[...], y[...], err_msg=str(path))
