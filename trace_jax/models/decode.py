"""Cached prefill of a right-padded batch, single-token decode, and greedy generation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from trace_jax.models.cache import KVCache
from trace_jax.models.qwen3 import ModelOutput, Policy


def at_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """x [B, T, ...] read at one position per row, index [B] -> [B, ...]."""
    return x[jnp.arange(x.shape[0]), index]


def prefill(model: Policy, input_ids: jax.Array, lengths: jax.Array, max_len: int,
            ) -> tuple[jax.Array, ModelOutput]:
    """Run right-padded prompts `input_ids` [B, T] (`lengths` [B] real tokens) into a fresh cache.

    Returns the logits at each row's last real token [B, V] and the full output (with cache).
    """
    cache = KVCache.init(model.cfg, input_ids.shape[0], max_len)
    out = model(input_ids, cache=cache, num_valid=lengths)
    return at_rows(out.logits, jnp.maximum(lengths - 1, 0)), out


def decode_step(model: Policy, tokens: jax.Array, cache: KVCache) -> ModelOutput:
    """Append one token per row (`tokens` [B]) at each row's own position."""
    return model(tokens[:, None], cache=cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "max_len"))
def _greedy(graphdef, state, input_ids, lengths, steps: int, max_len: int) -> jax.Array:
    model = nnx.merge(graphdef, state)
    last, out = prefill(model, input_ids, lengths, max_len)
    first = jnp.argmax(last, axis=-1).astype(jnp.int32)
    tokens = jnp.zeros((input_ids.shape[0], steps), jnp.int32).at[:, 0].set(first)

    def body(i, carry):
        cache, tokens = carry
        step = decode_step(model, tokens[:, i - 1], cache)
        nxt = jnp.argmax(step.logits[:, 0], axis=-1).astype(jnp.int32)
        return step.cache, tokens.at[:, i].set(nxt)

    _, tokens = jax.lax.fori_loop(1, steps, body, (out.cache, tokens))
    return tokens


def greedy_generate(model: Policy, input_ids: jax.Array, lengths: jax.Array, steps: int,
                    max_len: int | None = None) -> jax.Array:
    """Greedy continuation of right-padded prompts: [B, steps] new token ids (one compile per shape)."""
    max_len = input_ids.shape[1] + steps if max_len is None else max_len
    if max_len < input_ids.shape[1] + steps:
        raise ValueError(f"max_len={max_len} is too short for prompts of {input_ids.shape[1]} + {steps} steps")
    graphdef, state = nnx.split(model)
    return _greedy(graphdef, state, jnp.asarray(input_ids), jnp.asarray(lengths, jnp.int32), steps, max_len)
