"""Per-layer KV cache with per-row lengths, laid out so rows can be forked by gather."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from trace_jax.models.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer for a batch of rows (slots).

    Row b holds its tokens at cache positions 0 .. lengths[b]-1 (position == RoPE position);
    everything at or after lengths[b] is stale and masked by causality. Heads lead positions, the layout the
    attention's batched dots (over rows and heads) read without relaying out the cache at every step.
    """

    k: tuple[jax.Array, ...]  # cache_layers x [rows, kv_heads, cache_len, head_dim] (the predictor's last)
    v: tuple[jax.Array, ...]  # cache_layers x [rows, kv_heads, cache_len, head_dim]
    lengths: jax.Array  # [rows] int32
    AXES: ClassVar[tuple[str, ...]] = ("batch", "kv_heads", "cache_seq", "head_dim")  # logical axes of a k or v

    @staticmethod
    def layer_shape(cfg: ModelConfig, rows: int, max_len: int) -> tuple[int, int, int, int]:
        """The shape of one layer's keys (or values), in the order of `AXES`."""
        return rows, cfg.num_kv_heads, max_len, cfg.head_dim

    @classmethod
    def init(cls, cfg: ModelConfig, batch: int, max_len: int) -> KVCache:
        """An empty cache for `batch` rows of up to `max_len` positions, in the compute dtype."""
        shape = cls.layer_shape(cfg, batch, max_len)
        zeros = tuple(jnp.zeros(shape, cfg.jnp_dtype) for _ in range(cfg.cache_layers))
        return cls(k=zeros, v=tuple(jnp.zeros_like(z) for z in zeros),
                   lengths=jnp.zeros((batch,), jnp.int32))

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    def take(self, rows: jax.Array) -> KVCache:
        """Row i of the result is row rows[i] of this cache (a fork copies, never recomputes)."""
        return jax.tree.map(lambda a: jnp.take(a, rows, axis=0), self)

    def pad_to(self, max_len: int) -> KVCache:
        """The same rows with room for `max_len` positions (new positions are empty)."""
        pad = max_len - self.max_len
        if pad < 0:
            raise ValueError(f"cannot shrink a cache of {self.max_len} positions to {max_len}")
        widen = lambda a: jnp.pad(a, ((0, 0), (0, 0), (0, pad), (0, 0)))
        return KVCache(k=tuple(map(widen, self.k)), v=tuple(map(widen, self.v)), lengths=self.lengths)

    def with_lengths(self, lengths: jax.Array) -> KVCache:
        """Same cache, truncated (logically) to `lengths` [rows] positions per row."""
        return dataclasses.replace(self, lengths=lengths.astype(jnp.int32))


def write_positions(cache: jax.Array, positions: jax.Array, new: jax.Array) -> jax.Array:
    """cache [rows, kv_heads, cache_len, head_dim] with new [rows, positions, kv_heads, head_dim] written at
    positions [rows, positions] (those >= cache_len dropped).

    A decode step's one position per row, in a bfloat16 cache on a CPU, is written by a select over the whole
    cache: XLA:CPU would scatter bfloat16 by converting the whole cache to float32 and back at every step
    (docs/engine.md: the sampler section). Everywhere else a scatter writes the new positions only."""
    new = new.astype(cache.dtype)

    def scatter(cache: jax.Array, positions: jax.Array, new: jax.Array) -> jax.Array:
        # per row (vmap): the scatter's row axis is a batching dimension, which a mesh splitting the rows keeps on
        # each device; indexed by an iota it would all-gather every step's new keys and values across devices
        write = lambda c, p, n: c.at[:, p].set(jnp.swapaxes(n, 0, 1), mode="drop")  # [kv_heads, cache_len, ...]
        return jax.vmap(write)(cache, positions, new)

    def select(cache: jax.Array, positions: jax.Array, new: jax.Array) -> jax.Array:
        at = jnp.arange(cache.shape[2]) == positions  # [rows, cache_len]
        return jnp.where(at[:, None, :, None], jnp.swapaxes(new, 1, 2), cache)

    if new.shape[1] > 1 or cache.dtype != jnp.bfloat16:
        return scatter(cache, positions, new)
    return jax.lax.platform_dependent(cache, positions, new, cpu=select, default=scatter)
