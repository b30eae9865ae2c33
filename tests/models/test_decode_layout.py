"""A decode step reads the weights where they lie: XLA:CPU copies or transposes no weight matrix at a step (a copy
of every layer's output projection cost 2-3% of a 134M decode step, docs/measurements/sampler.md)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trace_jax.models.cache import KVCache
from trace_jax.models.config import ModelConfig
from trace_jax.models.decode import decode_step
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import Policy, matmul

# sizes chosen so that no activation of a 3-row step over 11 cache positions has as many elements as a weight matrix
CFG = ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16, rope_theta=1e4, tie_word_embeddings=True)
ROWS, LENGTH = 3, 11


def _moved_sizes(hlo: str) -> set[int]:
    """The element counts of every float array a copy or transpose in the compiled module makes."""
    shapes = re.findall(r"= (?:f32|bf16)\[([\d,]*)\]\S* (?:copy|transpose)\(", hlo)
    return {int(np.prod([int(d) for d in s.split(",") if d])) for s in shapes}


@pytest.mark.parametrize("tied, dtype", [(True, "float32"), (False, "float32"), (True, "bfloat16")])
def test_a_decode_step_copies_no_weight(tied, dtype):
    cfg = dataclasses.replace(CFG, tie_word_embeddings=tied, dtype=dtype, param_dtype=dtype)
    model = Policy(cfg, nnx.Rngs(0))
    weights = {int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)) if p.ndim >= 2}
    cache = KVCache.init(cfg, ROWS, LENGTH)
    hlo = jit_with_model(decode_step).lower(model, jnp.zeros((ROWS,), jnp.int32), cache).compile().as_text()
    assert not _moved_sizes(hlo) & weights
    # the output projection contracted over heads and head_dim as two axes is copied here, so the check can fail
    o_proj = list(model.layers)[0].self_attn.o_proj[...]
    out = jnp.zeros((ROWS, 1, cfg.num_heads, cfg.head_dim), cfg.jnp_dtype)
    two_axes = jax.jit(lambda o, w: matmul("btnh,nhd->btd", o, w)).lower(out, o_proj).compile().as_text()
    assert o_proj.size in _moved_sizes(two_axes)
