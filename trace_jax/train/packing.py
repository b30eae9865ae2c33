"""A tree-packed update: every distinct token of a rollout tree fed once, with the unpacked loss's values.

A continuation holds a copy of its parent root's tokens before `tree.start`, and the roots of one prompt each
hold its prompt tokens, so the unpacked loss feeds those copies through forward and backward again. Here each
token (s, p) has one canonical copy, at slot src[s, p]: the slot itself from its fork position on, before it
its owner's (a continuation's parent root; a root's the first root of its prompt, from prompt_len). The
canonical tokens of one prompt's slots share a row, prompts laid next-fit into R rows of Lp positions, and a
tree attention mask gives each token exactly the keys its slot's causal prefix holds: the loss, its
gradients and its metrics equal the unpacked ones up to float rounding. Letters: see `rollout/tree.py`;
R packed rows, Lp packed row length; a flat location is row * Lp + column.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from trace_jax.objectives import TokenWeights
from trace_jax.rollout.tree import Tree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packed:
    """A tree's update batch with every distinct token once: what the packed forward feeds and the loss scores."""

    tokens: jax.Array  # [R, Lp] int32 canonical tokens, 0 at padding
    slot: jax.Array  # [R, Lp] int32 the slot whose copy of the token this is, S at padding
    positions: jax.Array  # [R, Lp] int32 the token's position in its slot (RoPE), 0 at padding
    attend: jax.Array  # [R, Lp, Lp] bool query may see key: its slot's canonical copy of an earlier position
    prev: jax.Array  # [R, Lp] int32 flat location of the hidden state that predicts the token (its slot's p - 1)
    logp_old: jax.Array  # [R, Lp] float32 sampling log-probability of the canonical copy
    weights: TokenWeights  # [R, Lp] the policy-loss terms of every slot that holds the token
    reads: jax.Array  # [S, T+1] int32 flat location of each node's read position (`Tree.read_positions`)
    overflow: jax.Array  # [] bool some prompt did not fit (longer than Lp, or rows ran out): the packing is void

    @property
    def num_positions(self) -> int:
        """R * Lp: the rows x positions the packed forward feeds."""
        return self.tokens.size


def canonical_sources(tree: Tree) -> tuple[jax.Array, jax.Array]:
    """(src [S, L] int32 slot holding the canonical copy of token (s, p), fork [S] int32 first position a slot
    holds canonically). A used slot's canonical tokens are [fork, length); unused slots hold none."""
    s, max_len = tree.num_slots, tree.max_len
    slot = jnp.arange(s)
    root, cont = tree.is_root, tree.is_continuation
    same_prompt_roots = (tree.prompt[:, None] == tree.prompt[None, :]) & root[None, :]  # [S, S]
    first = jnp.min(jnp.where(same_prompt_roots, slot[None, :], s), axis=1)  # [S] the prompt's first root slot
    owner = jnp.where(cont, tree.parent, jnp.where(root, first, slot))
    fork = jnp.where(cont, tree.start, jnp.where(owner != slot, tree.prompt_len, 0))
    step = jnp.where(jnp.arange(max_len)[None, :] >= fork[:, None], slot[:, None], owner[:, None])  # [S, L]
    # owner chains are at most continuation -> root -> first root, with forks falling along them: one jump
    return step[step, jnp.arange(max_len)[None, :]], fork


def _next_fit(sizes: jax.Array, rows: int, row_len: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(row [G], column [G], overflow []) of groups of sizes [G] laid in order, each whole, into rows of row_len:
    a group opens the next row when it does not fit the current one's rest."""
    def place(carry: tuple[jax.Array, jax.Array], n: jax.Array):
        row, fill = carry
        new = (n > 0) & (fill + n > row_len)
        row, fill = row + new, jnp.where(new, 0, fill)
        return (row, fill + n), (row, fill)

    (last, _), (row, column) = jax.lax.scan(place, (jnp.int32(0), jnp.int32(0)), sizes)
    return row, column, jnp.any(sizes > row_len) | (last >= rows)


def _groups(tree: Tree, fork: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(count [S] canonical tokens of each slot, group [S] its dense prompt id (unused slots: 0, no tokens),
    sizes [S] canonical tokens of each prompt's tree, by group; zeros after the last)."""
    count = jnp.where(tree.used, jnp.maximum(tree.length - fork, 0), 0)
    group = jnp.searchsorted(jnp.sort(tree.prompt), tree.prompt)
    return count, group, jax.ops.segment_sum(count, group, tree.num_slots)


def prompt_sizes(tree: Tree) -> jax.Array:
    """[S] canonical tokens of each prompt's tree (dense prompt ids; zeros after the last): what a row must hold."""
    return _groups(tree, canonical_sources(tree)[1])[2]


def rows_needed(sizes: jax.Array, row_len: int) -> jax.Array:
    """[] int32 rows the packing's next-fit lays prompts of `sizes` [G] into, each whole, however many it takes."""
    return jnp.max(_next_fit(sizes, sizes.shape[0], row_len)[0]) + 1


def _canonical_locations(tree: Tree, fork: jax.Array, rows: int, row_len: int) -> tuple[jax.Array, jax.Array]:
    """(flat [S, L] int32 packed location of each canonical token, R * Lp elsewhere, overflow []): a prompt's
    slots' canonical tokens in slot order, prompts (by pool index) next-fit into the rows."""
    s, max_len = tree.num_slots, tree.max_len
    slot, pos = jnp.arange(s), jnp.arange(max_len)[None, :]
    count, group, sizes = _groups(tree, fork)
    row, column, overflow = _next_fit(sizes, rows, row_len)
    earlier = (group[None, :] == group[:, None]) & (slot[None, :] < slot[:, None])  # [S, S] before s in its row
    first_col = column[group] + jnp.sum(jnp.where(earlier, count[None, :], 0), axis=1)  # [S] of the slot's tokens
    col = (first_col - fork)[:, None] + pos  # [S, L]
    canonical = tree.used[:, None] & (pos >= fork[:, None]) & (pos < tree.length[:, None]) & (col < row_len)
    fits = canonical & (row[group] < rows)[:, None]
    return jnp.where(fits, row[group][:, None] * row_len + col, rows * row_len), overflow


def tree_mask(src: jax.Array, slot: jax.Array, pos: jax.Array, real: jax.Array) -> jax.Array:
    """[R, Lp, Lp] bool: query i sees key j of its row iff j is the canonical copy of an earlier (or the same)
    position of i's slot: p_j <= p_i and src[s_i, p_j] == s_j. slot, pos, real [R, Lp]: each packed token's slot,
    position and whether it is a token; padding sees itself only, so its softmax stays finite."""
    s_i = jnp.where(real, slot, 0)[:, :, None]
    same_path = src[s_i, pos[:, None, :]] == slot[:, None, :]  # [R, Lp, Lp]
    sees = real[:, :, None] & real[:, None, :] & (pos[:, None, :] <= pos[:, :, None]) & same_path
    return sees | jnp.eye(pos.shape[1], dtype=bool)[None]


def pack(tree: Tree, adv: jax.Array, rows: int, row_len: int) -> Packed:
    """The packed update batch of a finished tree with advantages adv [S] in R = rows rows of Lp = row_len
    positions (static)."""
    s, max_len = tree.num_slots, tree.max_len
    size = rows * row_len
    src, fork = canonical_sources(tree)
    flat, overflow = _canonical_locations(tree, fork, rows, row_len)
    pos = jnp.broadcast_to(jnp.arange(max_len)[None, :], (s, max_len))
    real = tree.used[:, None] & (pos < tree.length[:, None])  # [S, L]
    loc = jnp.where(real, flat[src, pos], size)  # [S, L] packed location of every real token's canonical copy

    def scatter(fill, values: jax.Array) -> jax.Array:  # [S, L] at the canonical tokens -> [R, Lp]
        return jnp.full((size,), fill, values.dtype).at[flat].set(values, mode="drop").reshape(rows, row_len)

    def add(values: jax.Array) -> jax.Array:  # [S, L] per loss term -> [R, Lp] summed at its canonical copy
        target = jnp.where(tree.policy_mask & (pos >= 1), loc, size)  # the unpacked mask, policy_mask[:, 1:]
        return jnp.zeros((size,), jnp.float32).at[target].add(values, mode="drop").reshape(rows, row_len)

    slot = scatter(s, jnp.broadcast_to(jnp.arange(s)[:, None], (s, max_len)))  # S at padding
    packed_pos = scatter(0, pos)
    a = jnp.broadcast_to(adv[:, None], (s, max_len))
    weights = TokenWeights(paths=add(jnp.ones((s, max_len))), pos_adv=add(jnp.maximum(a, 0.0)),
                           neg_adv=add(jnp.maximum(-a, 0.0)), num_pos=add((a > 0).astype(jnp.float32)),
                           num_neg=add((a < 0).astype(jnp.float32)))
    prev = jnp.where(pos >= 1, jnp.roll(loc, 1, axis=1), 0)  # (s, p - 1)'s canonical copy
    reads = jnp.take_along_axis(loc, tree.read_positions(), axis=1)  # [S, T+1]
    return Packed(tokens=scatter(0, tree.tokens), slot=slot, positions=packed_pos,
                  attend=tree_mask(src, slot, packed_pos, slot < s), prev=scatter(0, prev),
                  logp_old=scatter(0.0, tree.logprobs), weights=weights, reads=jnp.where(reads < size, reads, 0),
                  overflow=overflow)
