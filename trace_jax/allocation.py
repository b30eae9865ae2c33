"""Rollout budget allocators behind one interface: GRPO, PCL, random trees, TRACE and its ablations.

An allocator answers two questions of a training step with budgets M (root rollouts) and N
(continuations per root rollout) over a pool of B prompts (letters: see `rollout/tree.py`):
  roots(key, v_pool [B], M) -> m [B]: root rollouts per prompt, sum M;
  prefixes(key, roots, m, N) -> (K [M, T], unplaced [B]): continuations per anchor of the M
  finished root slots, and the stage-2 budget a prompt could not place.
A prompt's stage-2 budget is m_i * N, spread over its valid anchors: non-final turn boundaries
(r, t), t < num_turns[r] - 1, of its root rollouts that carry a predictor reading.
`Plan` binds an allocator to its budgets and lays the counts out as slots, exactly what
`rollout.expand` takes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from trace_jax.rollout.tree import Tree
from trace_jax.solvers import prefix_counts, root_counts
from trace_jax.validate import concrete

__all__ = ["ALLOCATORS", "Allocator", "Plan", "anchor_groups", "anchors_to_slots", "pcl_roots", "prefix_counts",
           "random_prefix_counts", "repeat_chance", "root_counts", "root_slots", "uniform_prefix_counts",
           "uniform_roots", "window"]

# name -> (root rule, prefix rule); "none" = no continuations.
ALLOCATORS: dict[str, tuple[str, str]] = {
    "grpo": ("uniform", "none"),
    "pcl": ("pcl", "none"),
    "random_tree": ("uniform", "random"),
    "uniform_tree": ("uniform", "uniform"),
    "trace": ("trace", "trace"),
    "trace_roots_uniform_prefix": ("trace", "uniform"),
    "uniform_roots_trace_prefix": ("uniform", "trace"),
}


def _check_total(name: str, counts: jax.Array, total: int, exact: bool) -> None:
    """Outside jit: counts >= 0 and summing to (at most, unless exact) total."""
    cv = concrete(counts)
    if cv is None:
        return
    if (cv < 0).any():
        raise ValueError(f"{name} has negative counts: {cv[cv < 0][:5].tolist()}")
    if cv.sum() > total or (exact and cv.sum() != total):
        raise ValueError(f"{name} sums to {int(cv.sum())}, expected {'' if exact else 'at most '}{total}")


def root_slots(m: jax.Array, num_roots: int) -> jax.Array:
    """prompt_of_slot [M] int32: pool index of each root slot, prompts contiguous in pool order."""
    _check_total("m", m, num_roots, exact=True)
    ends = jnp.cumsum(m)
    slot = jnp.arange(num_roots)
    prompt = jnp.searchsorted(ends, slot, side="right")
    return jnp.where(slot < ends[-1], prompt, Tree.NO_PROMPT).astype(jnp.int32)


def anchors_to_slots(k: jax.Array, num_roots: int, num_cont: int) -> tuple[jax.Array, jax.Array]:
    """(parent [M*N], branch_turn [M*N]) int32: K [M, T] continuations per anchor as slot entries.

    Continuations are listed in (root, turn) order, so each prompt's continuations are contiguous
    like its roots; slots beyond sum K get NO_PARENT / NO_TURN (unused).
    """
    if k.ndim != 2 or k.shape[0] != num_roots:
        raise ValueError(f"K must be [M={num_roots}, T], got shape {k.shape}")
    _check_total("K", k, num_roots * num_cont, exact=False)
    turns = k.shape[1]
    ends = jnp.cumsum(k.reshape(-1))
    slot = jnp.arange(num_roots * num_cont)
    anchor = jnp.searchsorted(ends, slot, side="right")
    used = slot < ends[-1]
    return (jnp.where(used, anchor // turns, Tree.NO_PARENT).astype(jnp.int32),
            jnp.where(used, anchor % turns, Tree.NO_TURN).astype(jnp.int32))


def uniform_roots(key: jax.Array, num_pool: int, num_roots: int, group_size: int) -> jax.Array:
    """m [B]: M // G prompts drawn uniformly from the pool without replacement, G rollouts each."""
    chosen = jax.random.permutation(key, num_pool)[: num_roots // group_size]
    return jnp.zeros(num_pool, jnp.int32).at[chosen].set(group_size)


def pcl_roots(key: jax.Array, v: jax.Array, num_roots: int, group_size: int) -> jax.Array:
    """m [B]: the M // G prompts whose predicted success v [B] is nearest 0.5 (random tie-break), G each."""
    b = v.shape[0]
    noise = jax.random.uniform(key, (b,))
    _, _, order = jax.lax.sort((jnp.abs(v - 0.5), noise, jnp.arange(b)), num_keys=2)
    return jnp.zeros(b, jnp.int32).at[order[: num_roots // group_size]].set(group_size)


def window(x: jax.Array, start: jax.Array | int, size: int) -> jax.Array:
    """x[start : start + size] along axis 0 (static size; past the end repeats x[0], for rows a caller masks)."""
    if size == x.shape[0] and isinstance(start, int) and start == 0:
        return x
    padded = jnp.concatenate([x, jnp.repeat(x[:1], size, axis=0)])  # also for typed PRNG key arrays
    return jax.lax.dynamic_slice_in_dim(padded, start, size)


def anchor_groups(tree: Tree, num_roots: int) -> tuple[jax.Array, jax.Array]:
    """(valid [M, T] bool, group [M] int32) of the root slots: usable anchors and their pool prompt."""
    prompt = tree.prompt[:num_roots]
    valid = (tree.used[:num_roots, None] & (jnp.arange(tree.max_turns) < tree.num_turns[:num_roots, None] - 1)
             & tree.has_reading[:num_roots, 1:])
    return valid, prompt


def repeat_chance(tree: Tree, num_roots: int) -> jax.Array:
    """q [M, T]: chance a continuation from (r, t) repeats root r's outcome, V~ if r won else 1 - V~."""
    v = jnp.clip(tree.success[:num_roots, 1:], 0.0, 1.0)
    return jnp.where(tree.reward[:num_roots, None] > 0.5, v, 1.0 - v)


def _group_keys(valid: jax.Array, group: jax.Array, num_groups: int) -> jax.Array:
    """[R*T] group of each anchor, num_groups for unusable ones."""
    usable = valid & (group != Tree.NO_PROMPT)[:, None] & (group < num_groups)[:, None]
    return jnp.where(usable, group[:, None], num_groups).reshape(-1)


def uniform_prefix_counts(noise: jax.Array, valid: jax.Array, group: jax.Array, budget: jax.Array
                          ) -> tuple[jax.Array, jax.Array]:
    """(K [R, T], unspent [G]): budget[g] spread as evenly as possible over group g's valid anchors.

    The budget % n leftover continuations go to the group's anchors of lowest noise [R*T] (uniform draws).
    """
    num_groups = budget.shape[0]
    gkey = _group_keys(valid, group, num_groups)
    idx = jnp.arange(gkey.size)
    key_s, _, idx_s = jax.lax.sort((gkey, noise, idx), num_keys=2)
    rank = jnp.zeros_like(idx).at[idx_s].set(idx - jnp.searchsorted(key_s, key_s, side="left"))
    count = jax.ops.segment_sum(jnp.ones_like(gkey), gkey, num_groups + 1)
    n = count[gkey]
    b = jnp.concatenate([budget, jnp.zeros(1, budget.dtype)])[gkey]
    k = jnp.where(gkey < num_groups, b // jnp.maximum(n, 1) + (rank < b % jnp.maximum(n, 1)), 0)
    return k.reshape(valid.shape).astype(jnp.int32), jnp.where(count[:num_groups] == 0, budget, 0)


def random_prefix_counts(noise: jax.Array, valid: jax.Array, group: jax.Array, budget: jax.Array
                         ) -> tuple[jax.Array, jax.Array]:
    """(K [R, T], unspent [G]): each of group g's budget[g] continuations picks a uniform valid anchor.

    noise [total]: one uniform draw per continuation (total >= sum budget), laid out group after group.
    """
    num_groups, total = budget.shape[0], noise.shape[0]
    gkey = _group_keys(valid, group, num_groups)
    key_s, idx_s = jax.lax.sort((gkey, jnp.arange(gkey.size)), num_keys=2)
    unit_group = jnp.searchsorted(jnp.cumsum(budget), jnp.arange(total), side="right")
    start = jnp.searchsorted(key_s, unit_group, side="left")
    n = jnp.searchsorted(key_s, unit_group, side="right") - start
    pick = start + jnp.minimum((noise * n).astype(jnp.int32), jnp.maximum(n - 1, 0))
    placed = (unit_group < num_groups) & (n > 0)
    k = jnp.zeros(gkey.size, jnp.int32).at[idx_s[jnp.minimum(pick, gkey.size - 1)]].add(placed)
    spent = jax.ops.segment_sum(placed.astype(jnp.int32), unit_group, num_groups + 1)[:num_groups]
    return k.reshape(valid.shape), budget - spent


@dataclasses.dataclass(frozen=True)
class Allocator:
    """One allocation rule, by registered name (see ALLOCATORS).

    group_size: rollouts per chosen prompt under uniform or PCL roots (must divide M).
    max_per_anchor: cap on continuations from one anchor under TRACE prefixes (None: the largest group's
    budget, never binds; the stage-2 solver sorts M*T*cap candidate units, so a smaller cap saves memory).
    max_roots: cap on root rollouts of one prompt under TRACE roots (None: M), so that one prompt's tree
    fits a rollout chunk.
    """

    name: str
    group_size: int | None = None
    max_per_anchor: int | None = None
    max_roots: int | None = None

    def __post_init__(self) -> None:
        if self.name not in ALLOCATORS:
            raise ValueError(f"unknown allocator {self.name!r}; known: {sorted(ALLOCATORS)}")
        if self.root_rule in ("uniform", "pcl") and (self.group_size is None or self.group_size < 1):
            raise ValueError(f"allocator {self.name!r} needs a group_size >= 1, got {self.group_size}")
        if self.max_per_anchor is not None and self.max_per_anchor < 1:
            raise ValueError(f"max_per_anchor must be >= 1, got {self.max_per_anchor}")
        if self.max_roots is not None and self.max_roots < 2:
            raise ValueError(f"max_roots must be >= 2 (a prompt needs two rollouts to contrast), got {self.max_roots}")

    @property
    def root_rule(self) -> str:
        return ALLOCATORS[self.name][0]

    @property
    def prefix_rule(self) -> str:
        return ALLOCATORS[self.name][1]

    @property
    def uses_prefixes(self) -> bool:
        """False for GRPO/PCL: their N budget is unused (size their M up for equal cost)."""
        return self.prefix_rule != "none"

    def largest_group(self, num_roots: int) -> int:
        """The most root rollouts one prompt can get out of M."""
        if self.root_rule == "trace":
            return min(self.max_roots or num_roots, num_roots)
        return self.group_size

    def roots(self, key: jax.Array, v_pool: jax.Array, num_roots: int) -> jax.Array:
        """m [B] int32 root rollouts per pool prompt, sum M, every m_i in {0} ∪ [2, max_roots] for TRACE."""
        if self.root_rule == "trace":
            return root_counts(v_pool, num_roots, self.max_roots)
        g, b = self.group_size, v_pool.shape[0]
        if num_roots % g or num_roots // g > b:
            raise ValueError(f"{self.name}: group_size={g} must divide M={num_roots} into at most "
                             f"B={b} prompts")
        if self.root_rule == "pcl":
            return pcl_roots(key, v_pool, num_roots, g)
        return uniform_roots(key, b, num_roots, g)

    def prefixes(self, key: jax.Array, roots: Tree, m: jax.Array, num_cont: int, first_root: jax.Array | int = 0,
                 all_roots: int | None = None) -> tuple[jax.Array, jax.Array]:
        """(K [R, T] int32 continuations per anchor, unplaced [B] int32) from the finished root slots.

        roots: R finished root slots. m [B]: the root counts of the prompts they hold, sum R (prompt i's
        stage-2 budget is m_i * N). unplaced: budget a prompt could not spend (no valid anchor, or
        every anchor at `max_per_anchor`); prefix-free allocators place nothing and report 0.
        A chunk of whole prompts: roots are slots [first_root, first_root + R) of a step's all_roots = M
        (static) and m counts only their prompts; the random rules then draw the step's noise for all M
        roots and read the chunk's window of it, so the chunk gets the same K rows as the whole step.
        """
        if num_cont < 0:
            raise ValueError(f"N (continuations per root) must be >= 0, got {num_cont}")
        num_roots = roots.num_slots
        all_roots = num_roots if all_roots is None else all_roots
        _check_total("m", m, num_roots, exact=all_roots == num_roots)
        if not self.uses_prefixes:
            return jnp.zeros((num_roots, roots.max_turns), jnp.int32), jnp.zeros(m.shape, jnp.int32)
        valid, group = anchor_groups(roots, num_roots)
        budget = m.astype(jnp.int32) * num_cont
        if self.prefix_rule == "trace":
            most = max(self.largest_group(all_roots) * num_cont, 1)  # one anchor never gets more: same K
            cap = min(self.max_per_anchor or most, most)
            return prefix_counts(repeat_chance(roots, num_roots), valid, group, budget, cap)
        per_root = roots.max_turns if self.prefix_rule == "uniform" else num_cont  # draws per root slot
        noise = window(jax.random.uniform(key, (all_roots * per_root,)), first_root * per_root,
                        num_roots * per_root)
        if self.prefix_rule == "uniform":
            return uniform_prefix_counts(noise, valid, group, budget)
        return random_prefix_counts(noise, valid, group, budget)


@dataclasses.dataclass(frozen=True)
class Plan:
    """An allocator bound to one run's budgets: the allocation `rollout.expand` asks for, as slots.

    Hashable, so it is a static argument of the compiled expansion.
    """

    allocator: Allocator
    roots: int  # M
    continuations: int  # N (0: no stage 2)

    def root_slots(self, key: jax.Array, v_pool: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Stage 1: (prompt_of_slot [M] pool index of each root slot, m [B] root counts)."""
        m = self.allocator.roots(key, v_pool, self.roots)
        return root_slots(m, self.roots), m

    def continuation_slots(self, key: jax.Array, roots: Tree, m: jax.Array, first_root: jax.Array | int = 0
                           ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Stage 2: (parent [R*N], branch_turn [R*N], unplaced [] int32) from the R finished roots and
        stage 1's m [B]; unused continuation slots get NO_PARENT. R = M, or a chunk of whole prompts
        starting at root slot first_root (m: their counts only; see `Allocator.prefixes`)."""
        k, unplaced = self.allocator.prefixes(key, roots, m, self.continuations, first_root, self.roots)
        parent, branch_turn = anchors_to_slots(k, roots.num_slots, self.continuations)
        return parent, branch_turn, unplaced.sum()


def one_episode_per_prompt(num_prompts: int) -> Plan:
    """Slot i rolls out pool prompt i once, no continuations (evaluation)."""
    return Plan(Allocator("grpo", group_size=1), roots=num_prompts, continuations=0)
