"""Numerics against transformers' PyTorch Qwen3 (the independent reference)."""

import jax.numpy as jnp
import numpy as np
import torch

from trace_jax.models import KVCache, Policy
from trace_jax.models.decode import decode_step, greedy_generate, prefill
from trace_jax.models.hf_io import from_pretrained
from trace_jax.models.jit import jit_with_model

TOL = 1e-4  # float32 max |diff| of logits
# one compilation per architecture and shape, not one eager op at a time
decode_step_jit = jit_with_model(decode_step)
forward = jit_with_model(Policy.__call__)
prefill_jit = jit_with_model(prefill, static_argnames=("max_len",))


def _ids(vocab: int, shape, seed=0) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, vocab, shape).astype(np.int32)


def test_logits_match_transformers(tiny_qwen3):
    hf_dir, ref = tiny_qwen3
    model = from_pretrained(hf_dir)
    ids = _ids(ref.config.vocab_size, (3, 17))
    with torch.no_grad():
        expected = ref(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    out = forward(model, jnp.asarray(ids))
    assert out.logits.shape == expected.shape
    assert out.hidden.shape == (3, 17, ref.config.hidden_size)
    assert out.success.shape == (3, 17)
    assert np.abs(np.asarray(out.logits) - expected).max() <= TOL


def test_cached_prefill_then_decode_equals_full_forward(tiny_qwen3):
    hf_dir, ref = tiny_qwen3
    model = from_pretrained(hf_dir)
    ids = _ids(ref.config.vocab_size, (3, 14), seed=1)
    full = forward(model, jnp.asarray(ids))
    # Rows have different prompt lengths (right padded): 5, 9, 3 tokens; the rest is decoded 1 by 1.
    lengths = np.array([5, 9, 3], np.int32)
    padded = np.where(np.arange(14)[None] < lengths[:, None], ids, 0)
    out = forward(model, jnp.asarray(padded), cache=KVCache.init(model.cfg, 3, 32), num_valid=jnp.asarray(lengths))
    pre = prefill_jit(model, jnp.asarray(padded), jnp.asarray(lengths), max_len=32)
    np.testing.assert_allclose(pre.logits, full.logits[np.arange(3), lengths - 1], atol=TOL)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(out.logits[b, :n], full.logits[b, :n], atol=TOL)
        np.testing.assert_allclose(out.success[b, :n], full.success[b, :n], atol=TOL)
    cache = out.cache
    for step in range(14 - lengths.min()):
        pos = lengths + step
        tok = ids[np.arange(3), np.minimum(pos, 13)]
        out = decode_step_jit(model, jnp.asarray(tok), cache)
        cache = out.cache
        for b in range(3):
            if pos[b] < 14:
                np.testing.assert_allclose(out.logits[b, 0], full.logits[b, pos[b]], atol=TOL)
    np.testing.assert_array_equal(cache.lengths, lengths + 14 - lengths.min())


def test_cache_rows_fork_by_gather(tiny_qwen3):
    """A row copied by gather continues exactly like the original row continuing, beside a different row."""
    hf_dir, ref = tiny_qwen3
    model = from_pretrained(hf_dir)
    ids = _ids(ref.config.vocab_size, (2, 12), seed=2)
    prefix = np.array([6, 4], np.int32)
    pre = prefill_jit(model, jnp.asarray(np.where(np.arange(12) < prefix[:, None], ids, 0)), jnp.asarray(prefix),
                      max_len=16)
    cache = pre.cache.take(jnp.array([0, 1, 0]))  # row 2 forks row 0; row 1 stays a different sequence
    assert isinstance(cache, KVCache)
    rows = np.array([0, 1, 0])
    full = forward(model, jnp.asarray(ids)).logits  # each original row continuing, uncached
    for step in range(5):  # continue every row with its original row's next tokens
        pos = prefix[rows] + step
        out = decode_step_jit(model, jnp.asarray(ids[rows, pos]), cache)
        cache = out.cache
        np.testing.assert_allclose(out.logits[:, 0], full[rows, pos], atol=TOL)
    np.testing.assert_allclose(cache.k[0][2, :11], cache.k[0][0, :11], atol=1e-6)


def test_greedy_generation_matches_transformers(tiny_qwen3):
    hf_dir, ref = tiny_qwen3
    model = from_pretrained(hf_dir)
    lengths = np.array([8, 5], np.int32)
    ids = _ids(ref.config.vocab_size, (2, 8), seed=3)
    ours = np.asarray(greedy_generate(model, jnp.asarray(ids), jnp.asarray(lengths), steps=32))
    for b, n in enumerate(lengths):
        with torch.no_grad():
            expected = ref.generate(torch.tensor(ids[b:b + 1, :n], dtype=torch.long), max_new_tokens=32,
                                    min_new_tokens=32, do_sample=False)[0, n:].numpy()
        np.testing.assert_array_equal(ours[b], expected)


def test_bfloat16_forward_tracks_float32(tiny_qwen3):
    hf_dir, ref = tiny_qwen3
    f32 = from_pretrained(hf_dir)
    bf16 = from_pretrained(hf_dir, dtype="bfloat16")
    assert bf16.embed_tokens[...].dtype == jnp.bfloat16
    ids = jnp.asarray(_ids(ref.config.vocab_size, (2, 9), seed=4))
    a, b = forward(f32, ids).logits, forward(bf16, ids).logits
    assert b.dtype == jnp.float32  # logits are returned in float32 for sampling
    # bf16 has ~3 significant digits; logits here are O(1).
    assert np.abs(np.asarray(a) - np.asarray(b)).max() < 0.1 * max(1.0, float(np.abs(a).max()))
    # mixed precision: float32 parameters, rounded to bfloat16 where they are used, compute as the bfloat16 model
    mixed = from_pretrained(hf_dir, compute_dtype="bfloat16")
    assert mixed.cfg.param_dtype == "float32" and mixed.cfg.dtype == "bfloat16"
    np.testing.assert_array_equal(mixed.layers[0].mlp.up_proj[...], f32.layers[0].mlp.up_proj[...])
    np.testing.assert_array_equal(forward(mixed, ids).logits, b)
