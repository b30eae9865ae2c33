"""A tree-packed update: every distinct token of a rollout tree fed once, with the unpacked loss's values.

A continuation holds a copy of its parent root's tokens before `tree.start`, and the roots of one prompt each
hold its prompt tokens, so the unpacked loss feeds those copies through forward and backward again. Here each
token (s, p) has one canonical copy, at slot src[s, p]: the slot itself from its fork position on, before it
its owner's (a continuation's parent root; a root's the first root of its prompt, from prompt_len). The
canonical tokens of one prompt's slots share a row, prompts laid next-fit into R rows of Lp positions. Each
slot's tokens start a block of Bk positions (the rest of its last block is padding), so a block of queries
belongs to one slot and attends over that slot's L positions gathered from the row (`models.Paged`): exactly
the keys its causal prefix holds, at L keys a query rather than Lp. The loss, its gradients and its metrics
equal the unpacked ones up to float rounding. Letters: see `rollout/tree.py`; R packed rows, Lp packed row
length, Bk block length; a flat location is row * Lp + column.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from trace_jax.models import Paged
from trace_jax.objectives import TokenWeights
from trace_jax.rollout.tree import Tree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packed:
    """A tree's update batch with every distinct token once: what the packed forward feeds and the loss scores."""

    tokens: jax.Array  # [R, Lp] int32 canonical tokens, 0 at padding
    slot: jax.Array  # [R, Lp] int32 the slot whose copy of the token this is, S at padding
    positions: jax.Array  # [R, Lp] int32 the token's position in its slot (RoPE), 0 at padding
    paged: Paged  # keys [R, Lp/Bk, L]: column of the block's slot's position p; attend [R, Lp/Bk, Bk, L]: p <= own
    prev: jax.Array  # [R, Lp] int32 flat location of the hidden state that predicts the token (its slot's p - 1)
    logp_old: jax.Array  # [R, Lp] float32 sampling log-probability of the canonical copy
    weights: TokenWeights  # [R, Lp] the policy-loss terms of every slot that holds the token
    reads: jax.Array  # [S, T+1] int32 flat location of each node's read position (`Tree.read_positions`)
    overflow: jax.Array  # [] bool some prompt did not fit (longer than Lp, or rows ran out): the packing is void
    needed: jax.Array  # [] int32 positions the tree takes in whole blocks, all rows together (the least R * Lp)

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


def _groups(tree: Tree, fork: jax.Array, block: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(span [S] positions each slot's canonical tokens take, rounded up to whole blocks, group [S] its dense
    prompt id (unused slots: 0, no tokens), sizes [S] positions each prompt's tree takes, by group; zeros after
    the last)."""
    count = jnp.where(tree.used, jnp.maximum(tree.length - fork, 0), 0)
    span = -(-count // block) * block
    group = jnp.searchsorted(jnp.sort(tree.prompt), tree.prompt)
    return span, group, jax.ops.segment_sum(span, group, tree.num_slots)


def prompt_sizes(tree: Tree, block: int) -> jax.Array:
    """[S] positions each prompt's tree takes in blocks of `block` (dense prompt ids; zeros after the last): what
    a row must hold."""
    return _groups(tree, canonical_sources(tree)[1], block)[2]


def _canonical_locations(tree: Tree, fork: jax.Array, rows: int, row_len: int, block: int
                         ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(flat [S, L] int32 packed location of each canonical token, R * Lp elsewhere, overflow [], needed [] the
    positions of every prompt's tree together): a prompt's
    slots' canonical tokens in slot order, each slot's from a block's start, prompts (by pool index) next-fit
    into the rows."""
    s, max_len = tree.num_slots, tree.max_len
    slot, pos = jnp.arange(s), jnp.arange(max_len)[None, :]
    span, group, sizes = _groups(tree, fork, block)
    row, column, overflow = _next_fit(sizes, rows, row_len)
    earlier = (group[None, :] == group[:, None]) & (slot[None, :] < slot[:, None])  # [S, S] before s in its row
    first_col = column[group] + jnp.sum(jnp.where(earlier, span[None, :], 0), axis=1)  # [S] of the slot's tokens
    col = (first_col - fork)[:, None] + pos  # [S, L]
    canonical = tree.used[:, None] & (pos >= fork[:, None]) & (pos < tree.length[:, None]) & (col < row_len)
    fits = canonical & (row[group] < rows)[:, None]
    return jnp.where(fits, row[group][:, None] * row_len + col, rows * row_len), overflow, jnp.sum(sizes)


def paged_keys(loc: jax.Array, slot: jax.Array, pos: jax.Array, block: int) -> Paged:
    """Each block's keys: its slot's positions 0..L-1 at their canonical copies' columns, seen up to the query's
    own position. loc [S, L] flat location of (s, p)'s canonical copy (R * Lp past a slot's length); slot, pos
    [R, Lp]: each packed position's slot (S at padding) and position. A padding query (position 0) sees the
    first key only, so its softmax stays finite."""
    rows, row_len = slot.shape
    s, max_len = loc.shape
    owner = slot[:, ::block]  # [R, Lp/Bk] a block's first position holds its slot's first token, or is padding
    cols = jnp.where(owner[..., None] < s, loc[jnp.minimum(owner, s - 1)] % row_len, 0)  # [R, Lp/Bk, L]
    query = pos.reshape(rows, row_len // block, block)
    return Paged(keys=cols, attend=jnp.arange(max_len) <= query[..., None])


def auto_row_len(slots: int, slot_len: int, rows: int, block: int) -> int:
    """Lp of `pack_len: 0`: R x Lp the least whole blocks holding half the unpacked S x L positions. (The default
    HopWorld run's trees took 0.15-0.24 of S x L packed; a tree that needs more runs unpacked.)"""
    return -(-slots * slot_len // (2 * rows * block)) * block


def pack(tree: Tree, adv: jax.Array, rows: int, row_len: int, block: int) -> Packed:
    """The packed update batch of a finished tree with advantages adv [S] in R = rows rows of Lp = row_len
    positions, in blocks of Bk = block positions (static; Lp a multiple of Bk)."""
    s, max_len = tree.num_slots, tree.max_len
    size = rows * row_len
    src, fork = canonical_sources(tree)
    flat, overflow, needed = _canonical_locations(tree, fork, rows, row_len, block)
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
                  paged=paged_keys(loc, slot, packed_pos, block), prev=scatter(0, prev),
                  logp_old=scatter(0.0, tree.logprobs), weights=weights, reads=jnp.where(reads < size, reads, 0),
                  overflow=overflow, needed=needed)
