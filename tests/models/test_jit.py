"""`jit_with_model`: one compilation per model graph and shapes, parameters as traced state, bound calls."""

import dataclasses

import jax.numpy as jnp
import numpy as np

from toy import TINY_POLICY
from trace_jax.models.jit import jit_with_model
from trace_jax.sharding import init_policy


def test_calls_and_bound_calls_share_one_program_per_graph_and_read_their_parameters():
    logits = jit_with_model(lambda model, ids: model(ids).logits)
    ids = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    a, b = init_policy(TINY_POLICY, seed=0), init_policy(TINY_POLICY, seed=1)  # one graph, other weights
    want_a, want_b = np.asarray(a(ids).logits), np.asarray(b(ids).logits)
    assert np.abs(want_a - want_b).max() > 1e-3
    np.testing.assert_allclose(logits(a, ids), want_a, atol=1e-6)
    bound_b = logits.bind(b)  # split once: its own graph object, equal to a's
    np.testing.assert_allclose(bound_b(ids), want_b, atol=1e-6)
    np.testing.assert_allclose(logits.bind(a)(ids), want_a, atol=1e-6)
    np.testing.assert_allclose(bound_b(ids), want_b, atol=1e-6)
    assert logits.cache_size() == 1  # equal graphs: one program, whatever object carries the graph
    wider = init_policy(dataclasses.replace(TINY_POLICY, intermediate_size=96), seed=0)
    np.testing.assert_allclose(logits.bind(wider)(ids), wider(ids).logits, atol=1e-6)
    assert logits.cache_size() == 2  # another graph: its own program
