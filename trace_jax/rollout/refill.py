"""Slot refill: one step's expansion on S_live < M*(1+N) live rows, each taking the next work item as it frees.

The work items are the step's slots, M roots then M*N continuations, laid out, keyed and allocated as in
`rollout.expand.expand`, so under the same key the tree is the same, slot for slot. Turns stay synchronous
over the live rows; between turns (`settle`) a row whose episode ended writes its slot into the step's tree (a
root also keeps its KV cache, boundary hidden states and env state for its forks) and takes the next pending
item: the next root not yet started, else the next continuation ready.

Stage 2 is solved for a prompt as soon as its roots have all finished (its budget m_i * N over its own anchors,
as `expand` does it). A continuation's slot, and so its key, comes after every continuation of the prompts
before it, so a prompt's continuations are ready once it and every prompt before it are solved; prompts start
their roots in pool order, so the earlier ones mostly finish first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from trace_jax.allocation import Plan
from trace_jax.envs.base import JaxEnv
from trace_jax.models.decode import Prefill
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import Rollout, SamplingConfig, play_turn, rows_where
from trace_jax.rollout.expand import Pool, concat, fork, join_phases, prefill_pool, start_roots
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import constrain_rows

NO_ITEM = -1  # `Work.item` of an idle live row


def runs_refilled(plan: Plan, live_slots: int) -> bool:
    """Whether a step of `plan` runs on refilled rows: live_slots set and below its M * (1 + N) slots."""
    return 0 < live_slots < plan.roots * (1 + plan.continuations)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Work:
    """One step's expansion in flight: the live rows, the queue, and the slots finished so far."""

    live: Rollout  # [S_live] rows in flight (idle ones are done)
    item: jax.Array  # [S_live] int32 step slot each live row runs, NO_ITEM when idle
    roots: Rollout  # [M] finished root slots (tree rows, caches, boundary states, env states: what forks copy);
    # a row not written yet is unused (`roots.tree.used` marks the finished ones)
    conts: Tree  # [M*N] finished continuation slots
    parent: jax.Array  # [M*N] int32 stage 2 of the solved prompts (NO_PARENT beyond them)
    branch_turn: jax.Array  # [M*N] int32
    solved: jax.Array  # [] int32 root slots [0, solved) hold prompts whose stage 2 is solved
    next_root: jax.Array  # [] int32 first root slot not yet started
    next_cont: jax.Array  # [] int32 first continuation slot not yet started
    unplaced: jax.Array  # [] int32 stage-2 budget of the solved prompts left unplaced
    pool: Pool
    prefilled: Prefill  # [B] the pool's prefill: root rows copy their prompt's cache row
    prompt_of_slot: jax.Array  # [M] int32
    m: jax.Array  # [B] int32 stage 1's root counts
    root_keys: jax.Array  # [M] keys of the root slots, as in `expand`
    cont_keys: jax.Array  # [M*N] keys of the continuation slots
    prefix_key: jax.Array  # stage 2's key

    @property
    def pending(self) -> jax.Array:
        """[] bool: an item is ready and not started."""
        ready = (self.parent != Tree.NO_PARENT).sum()
        return (self.next_root < self.root_keys.shape[0]) | (self.next_cont < ready)


_ROW_FIELDS = ("tree", "cache", "logits", "boundary_hidden", "env_state", "keys")  # Rollout fields with a slot axis


def _rows(ro: Rollout) -> dict[str, Any]:
    return {f: getattr(ro, f) for f in _ROW_FIELDS}


def _select_rows(mask: jax.Array, new: Rollout, old: Rollout) -> Rollout:
    """old with its rows where mask [S] replaced by new's (the counters stay old's)."""
    return dataclasses.replace(old, **rows_where(mask, _rows(new), _rows(old)))


def _scatter_rows(dst: Any, at: jax.Array, src: Any) -> Any:
    """dst with row at[i] set to src's row i (at[i] out of range: dropped)."""
    return jax.tree.map(lambda d, s: d.at[at].set(s, mode="drop"), dst, src)


def solve_prefix(plan: Plan, key: jax.Array, roots: Tree, m: jax.Array, solved: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Stage 2 of the prompts on root slots [0, solved) (whole prompts), the others masked out: (parent [M*N],
    branch_turn [M*N], unplaced []). Each prompt spends its own budget and later continuations come after, so
    these entries are the whole step's first ones."""
    mine = jnp.arange(roots.num_slots) < solved
    masked = dataclasses.replace(roots, prompt=jnp.where(mine, roots.prompt, Tree.NO_PROMPT))
    return plan.continuation_slots(key, masked, jnp.where(jnp.cumsum(m) <= solved, m, 0))


def start(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, *, plan: Plan, live_slots: int, pad_id: int
          ) -> tuple[Work, jax.Array]:
    """Prefill the pool, allocate roots (stage 1, as `expand`) and fill the live rows: (work, pool_v [B])."""
    k_roots, k_prefix, k_root_slots, k_cont_slots = jax.random.split(key, 4)
    pre = prefill_pool(model, pool)
    prompt_of_slot, m = plan.root_slots(k_roots, pre.success)
    none = jnp.full((plan.roots,), Tree.NO_PROMPT, jnp.int32)
    root_keys = jax.random.split(k_root_slots, plan.roots)
    roots = start_roots(model, env, pool, pre, none, root_keys, pad_id=pad_id)
    idle = start_roots(model, env, pool, pre, jnp.repeat(none[:1], live_slots), jnp.repeat(root_keys[:1], live_slots),
                       pad_id=pad_id)
    conts = plan.roots * plan.continuations
    work = Work(live=idle, item=jnp.full((live_slots,), NO_ITEM, jnp.int32), roots=roots,
                conts=Tree.empty(conts, roots.tree.max_len, roots.tree.max_turns, pad_id),
                parent=jnp.full((conts,), Tree.NO_PARENT, jnp.int32),
                branch_turn=jnp.full((conts,), Tree.NO_TURN, jnp.int32), solved=jnp.int32(0),
                next_root=jnp.int32(0), next_cont=jnp.int32(0), unplaced=jnp.int32(0), pool=pool, prefilled=pre,
                prompt_of_slot=prompt_of_slot, m=m, root_keys=root_keys,
                cont_keys=jax.random.split(k_cont_slots, max(conts, 1))[:conts], prefix_key=k_prefix)
    return refill(model, env, work, pad_id=pad_id), pre.success


def refill(model: Policy, env: JaxEnv, w: Work, *, pad_id: int) -> Work:
    """Idle live rows, in row order, take the pending items: roots first, then ready continuations."""
    def take(w: Work) -> Work:
        num_roots, idle = w.root_keys.shape[0], w.item == NO_ITEM
        rank = jnp.cumsum(idle) - 1
        roots_left = num_roots - w.next_root
        ready = (w.parent != Tree.NO_PARENT).sum()
        to_root = idle & (rank < roots_left)
        to_cont = idle & ~to_root & (rank - roots_left < ready - w.next_cont)
        root = jnp.minimum(w.next_root + rank, num_roots - 1)
        cont = jnp.clip(w.next_cont + rank - roots_left, 0, max(w.parent.shape[0] - 1, 0))
        live = w.live
        new = start_roots(model, env, w.pool, w.prefilled,
                          jnp.where(to_root, w.prompt_of_slot[root], Tree.NO_PROMPT), w.root_keys[root],
                          pad_id=pad_id, slot_len=live.tree.max_len)
        live = _select_rows(to_root, new, live)
        if w.parent.shape[0]:
            new = fork(model, env, w.roots, jnp.where(to_cont, w.parent[cont], Tree.NO_PARENT),
                       jnp.where(to_cont, w.branch_turn[cont], Tree.NO_TURN), w.cont_keys[cont], pad_id=pad_id)
            live = _select_rows(to_cont, new, live)
        item = jnp.where(to_root, root, jnp.where(to_cont, num_roots + cont, w.item))
        return dataclasses.replace(w, live=live, item=item.astype(jnp.int32), next_root=w.next_root + to_root.sum(),
                                   next_cont=w.next_cont + to_cont.sum())

    return jax.lax.cond((w.item == NO_ITEM).any() & w.pending, take, lambda w: w, w)


def settle(model: Policy, env: JaxEnv, w: Work, *, plan: Plan, pad_id: int) -> Work:
    """After a turn: write the ended episodes' slots, solve stage 2 of the prompts whose roots are now all
    finished (and every prompt's before them), and refill the freed rows."""
    num_roots = plan.roots
    ended = w.live.tree.done & (w.item != NO_ITEM)
    is_root = w.item < num_roots
    at_root = jnp.where(ended & is_root, w.item, num_roots)
    roots = dataclasses.replace(w.roots, **_scatter_rows(_rows(w.roots), at_root, _rows(w.live)))
    conts = _scatter_rows(w.conts, jnp.where(ended & ~is_root, w.item - num_roots, w.conts.num_slots), w.live.tree)
    finished = roots.tree.used
    lead = jnp.where(finished.all(), num_roots, jnp.argmin(finished))  # the first root still running
    solved = jnp.where(lead == num_roots, num_roots,
                       jnp.searchsorted(w.prompt_of_slot, w.prompt_of_slot[jnp.minimum(lead, num_roots - 1)]))
    w = dataclasses.replace(w, item=jnp.where(ended, NO_ITEM, w.item), roots=roots, conts=conts)

    def solve(w: Work) -> Work:
        parent, branch_turn, unplaced = solve_prefix(plan, w.prefix_key, w.roots.tree, w.m, solved)
        return dataclasses.replace(w, parent=parent, branch_turn=branch_turn, unplaced=unplaced, solved=solved)

    if plan.continuations:
        w = jax.lax.cond(solved > w.solved, solve, lambda w: w, w)
    return refill(model, env, w, pad_id=pad_id)


def finish(w: Work) -> tuple[Tree, dict[str, jax.Array]]:
    """The step's tree [M + M*N] and the expansion's stats (`rollout.expand.join_phases`'s, over the live rows)."""
    return concat(w.roots.tree, w.conts), join_phases([w.live], w.unplaced)[1]


def expand(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, *, plan: Plan, sampling: SamplingConfig,
           pad_id: int, live_slots: int, mesh: Mesh | None = None) -> tuple[Tree, jax.Array, dict[str, jax.Array]]:
    """`rollout.expand.expand` on live_slots rows refilled between turns: the same (tree [S], pool_v [B]) under
    the same key, and its stats over the live rows (utilisation = live tokens / (live_slots x decode steps))."""
    w, pool_v = start(model, env, pool, key, plan=plan, live_slots=live_slots, pad_id=pad_id)

    def body(w: Work) -> Work:
        live = play_turn(model, env, constrain_rows(w.live, mesh), sampling=sampling)
        return settle(model, env, dataclasses.replace(w, live=constrain_rows(live, mesh)), plan=plan, pad_id=pad_id)

    w = jax.lax.while_loop(lambda w: (w.item != NO_ITEM).any(), body, w)
    tree, stats = finish(w)
    return constrain_rows(tree, mesh), pool_v, stats


expand_refilled = jit_with_model(expand, static_argnames=("plan", "sampling", "pad_id", "live_slots", "mesh"))
expand_refilled.__doc__ = "`expand` compiled once per (model graph, shapes, plan, sampling, live slots, mesh)."
