"""Cached prefill of a right-padded batch, single-token decode, and greedy generation."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from trace_jax.models.cache import KVCache
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import ModelOutput, Policy


def at_rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """x [rows, positions, ...] read at one position per row, index [rows] -> [rows, ...]. Row by row: a batched
    gather, which a mesh splitting the rows runs on each device (rows indexed by an iota are gathered first)."""
    return jax.vmap(lambda row, i: row[i])(x, index)


def write_at_rows(x: jax.Array, index: jax.Array, values: jax.Array) -> jax.Array:
    """x [rows, positions, ...] with values [rows, W, ...] written at index [rows, W] (or one value [rows, ...] at
    index [rows]); indices >= positions are dropped. Row by row, as `at_rows` reads: a batched scatter, which a mesh
    splitting the rows runs on each device, where rows indexed by an iota would be all-gathered first."""
    return jax.vmap(lambda row, i, v: row.at[i].set(v, mode="drop"))(x, index, values)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Prefill:
    """Right-padded prompts run into a fresh cache, read at each row's last real token."""

    cache: KVCache  # rows x max_len positions, lengths = the prompts' lengths
    logits: jax.Array  # [rows, vocab] next-token logits
    success: jax.Array  # [rows] V~ of each prompt


def prefill(model: Policy, input_ids: jax.Array, lengths: jax.Array, max_len: int) -> Prefill:
    """Run prompts `input_ids` [rows, positions] (`lengths` [rows] real tokens, right-padded) into a
    fresh cache of `max_len` positions."""
    cache = KVCache.init(model.cfg, input_ids.shape[0], max_len)
    out = model(input_ids, cache=cache, num_valid=lengths)
    last = jnp.maximum(lengths - 1, 0)
    # the head on each row's last hidden state only: the unused [rows, positions, vocab] logits are dead code
    logits = model.logits_from_hidden(at_rows(out.hidden, last))
    return Prefill(cache=out.cache, logits=logits, success=at_rows(out.success, last))


def decode_step(model: Policy, tokens: jax.Array, cache: KVCache) -> ModelOutput:
    """Append one token per row (`tokens` [rows]) at each row's own position."""
    return model(tokens[:, None], cache=cache)


def _greedy(model: Policy, input_ids: jax.Array, lengths: jax.Array, steps: int, max_len: int) -> jax.Array:
    pre = prefill(model, input_ids, lengths, max_len)
    first = jnp.argmax(pre.logits, axis=-1).astype(jnp.int32)
    tokens = jnp.zeros((input_ids.shape[0], steps), jnp.int32).at[:, 0].set(first)

    def body(i, carry):
        cache, tokens = carry
        step = decode_step(model, tokens[:, i - 1], cache)
        nxt = jnp.argmax(step.logits[:, 0], axis=-1).astype(jnp.int32)
        return step.cache, tokens.at[:, i].set(nxt)

    _, tokens = jax.lax.fori_loop(1, steps, body, (pre.cache, tokens))
    return tokens


_greedy_jit = jit_with_model(_greedy, static_argnames=("steps", "max_len"))


def greedy_generate(model: Policy, input_ids: jax.Array, lengths: jax.Array, steps: int,
                    max_len: int | None = None) -> jax.Array:
    """Greedy continuation of right-padded prompts: [rows, steps] new token ids (one compile per shape)."""
    max_len = input_ids.shape[1] + steps if max_len is None else max_len
    if max_len < input_ids.shape[1] + steps:
        raise ValueError(f"max_len={max_len} is too short for prompts of {input_ids.shape[1]} + {steps} steps")
    return _greedy_jit(model, jnp.asarray(input_ids), jnp.asarray(lengths, jnp.int32), steps=steps, max_len=max_len)
