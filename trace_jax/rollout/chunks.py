"""Budgets larger than memory: one step's expansion rolled out in chunks of whole prompts.

Allocation stays global. Stage 1 runs over the whole pool (`allocate_roots`); its root slots, contiguous per
prompt, are cut into chunks of at most R root slots holding whole prompts (`chunk_bounds`). A chunk rolls out
its roots, solves stage 2 for its own prompts (each prompt's budget m_i * N over its own anchors, exactly as
the whole step would) and rolls out those continuations (`rollout_chunk`), so at most R * (1 + N) slots hold a
KV cache at once, and each prompt's advantage groups are complete in its chunk.

Every root and continuation slot keeps the key it has in the whole step (its index in the step's split
keys) and the random stage-2 rules read the step's noise at the chunk's window, so `place_chunks` of the
chunks gives the tree `expand` samples under the same key, slot for slot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from trace_jax.allocation import Plan, window
from trace_jax.envs.base import JaxEnv
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import Rollout, SamplingConfig, run_turns
from trace_jax.rollout.expand import Pool, fork, join_phases, prefill_pool, start_roots
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import constrain_rows, data_parallel_size, to_host


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk's rollout: its tree (R roots, then R*N continuations, parents chunk-local) and where its
    slots sit in the whole step: roots [first_root, end_root), its `conts` continuations from first_cont on."""

    tree: Tree
    first_root: int
    end_root: int
    first_cont: int
    conts: int
    stats: dict[str, jax.Array]


def runs_in_chunks(plan: Plan, chunk_slots: int) -> bool:
    """Whether a step of `plan` runs in chunks: chunk_slots set and below its M * (1 + N) slots."""
    return 0 < chunk_slots < plan.roots * (1 + plan.continuations)


def check_chunk(plan: Plan, chunk_slots: int, rows_multiple: int = 1) -> int:
    """R, the root slots of a chunk of `chunk_slots` slots, rounded down to a multiple of rows_multiple (the
    data-parallel size: each device then rolls out an equal share) where that leaves any; fails when one
    prompt's tree cannot fit."""
    per_root = 1 + plan.continuations
    largest = plan.allocator.largest_group(plan.roots)
    r = min(chunk_slots // per_root, plan.roots)
    if r >= rows_multiple:
        r -= r % rows_multiple
    if r < largest:
        least = largest if largest < rows_multiple else -(-largest // rows_multiple) * rows_multiple
        raise ValueError(
            f"chunk_slots={chunk_slots} cannot hold one prompt's tree: {plan.allocator.name} may give a prompt "
            f"{largest} root rollouts, each with N={plan.continuations} continuations, {largest * per_root} slots; "
            f"raise chunk_slots to at least {least * per_root}"
            + (f" (chunks hold a multiple of {rows_multiple} roots, the data-parallel size)" if least > largest else "")
            + (" or lower max_roots_per_prompt" if plan.allocator.root_rule == "trace" else ""))
    return r


def chunk_bounds(prompt_of_slot: np.ndarray, chunk_roots: int) -> list[tuple[int, int]]:
    """[(first_root, end_root)]: root slots [M] (contiguous per prompt) cut greedily into chunks of at most
    chunk_roots slots, never splitting a prompt."""
    pos = np.asarray(prompt_of_slot)
    starts = [0] + [i for i in range(1, len(pos)) if pos[i] != pos[i - 1]]
    runs = list(zip(starts, starts[1:] + [len(pos)]))
    bounds, lo = [], 0
    for a, b in runs:
        if b - a > chunk_roots:
            raise ValueError(f"prompt {int(pos[a])} has {b - a} root rollouts, more than a chunk's {chunk_roots}")
        if b - lo > chunk_roots:
            bounds.append((lo, a))
            lo = a
    return bounds + [(lo, len(pos))]


def allocate(model: Policy, pool: Pool, key: jax.Array, *, plan: Plan) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Stage 1 over the whole pool, as `expand` does it: (prompt_of_slot [M], m [B], pool_v [B])."""
    k_roots = jax.random.split(key, 4)[0]
    pool_v = prefill_pool(model, pool).success
    prompt_of_slot, m = plan.root_slots(k_roots, pool_v)
    return prompt_of_slot, m, pool_v


allocate_roots = jit_with_model(allocate, static_argnames=("plan",))


def start_chunk(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, prompt_of_slot: jax.Array,
                first_root: jax.Array, end_root: jax.Array, *, plan: Plan, chunk_roots: int, pad_id: int
                ) -> tuple[Rollout, jax.Array]:
    """A chunk's R root slots at the start of their episodes: slots [first_root, end_root) of the step's
    prompt_of_slot [M] (whole prompts), the rest unused. Returns (roots, m [B]: their prompts' root counts).
    The chunk prefills its root rows itself (R x P positions in fed_positions)."""
    k_root_slots = jax.random.split(key, 4)[2]
    r, b = chunk_roots, pool.lengths.shape[0]
    own = jnp.arange(r) < end_root - first_root
    prompt = jnp.where(own, window(prompt_of_slot, first_root, r), Tree.NO_PROMPT)
    src = jnp.maximum(prompt, 0)
    rows = Pool(tokens=pool.tokens[src], lengths=pool.lengths[src], question=pool.question[src])
    keys = window(jax.random.split(k_root_slots, plan.roots), first_root, r)
    ro = start_roots(model, env, rows, prefill_pool(model, rows), jnp.where(own, jnp.arange(r), Tree.NO_PROMPT),
                     keys, pad_id=pad_id)
    m = jnp.zeros(b, jnp.int32).at[jnp.where(own, prompt, b)].add(1, mode="drop")
    return dataclasses.replace(ro, tree=dataclasses.replace(ro.tree, prompt=prompt)), m


def fork_chunk(model: Policy, env: JaxEnv, roots: Rollout, m: jax.Array, key: jax.Array, first_root: jax.Array,
               first_cont: jax.Array, *, plan: Plan, pad_id: int) -> tuple[Rollout, jax.Array]:
    """Stage 2 of a chunk's finished roots (its prompts' counts m [B]) and their R*N continuation slots, whose
    first takes the step's continuation slot first_cont: (continuations, unplaced [])."""
    _, k_prefix, _, k_cont_slots = jax.random.split(key, 4)
    parent, branch_turn, unplaced = plan.continuation_slots(k_prefix, roots.tree, m, first_root)
    keys = window(jax.random.split(k_cont_slots, plan.roots * plan.continuations), first_cont, parent.shape[0])
    return fork(model, env, roots, parent, branch_turn, keys, pad_id=pad_id), unplaced


def rollout(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, prompt_of_slot: jax.Array,
            first_root: jax.Array, end_root: jax.Array, first_cont: jax.Array, *, plan: Plan, chunk_roots: int,
            sampling: SamplingConfig, pad_id: int, mesh: Mesh | None = None) -> tuple[Tree, dict[str, jax.Array]]:
    """One chunk in one program: `start_chunk`, its roots' turns, `fork_chunk`, the continuations' turns.
    Returns (tree [R * (1 + N)]: roots, then continuations with chunk-local parents; stats as `expand`'s)."""
    ro, m = start_chunk(model, env, pool, key, prompt_of_slot, first_root, end_root, plan=plan,
                        chunk_roots=chunk_roots, pad_id=pad_id)
    phases = [run_turns(model, env, constrain_rows(ro, mesh), sampling=sampling)]
    unplaced = jnp.zeros((), jnp.int32)
    if plan.continuations:
        cont, unplaced = fork_chunk(model, env, phases[0], m, key, first_root, first_cont, plan=plan, pad_id=pad_id)
        phases.append(run_turns(model, env, constrain_rows(cont, mesh), sampling=sampling))
    tree, stats = join_phases(phases, unplaced)
    return constrain_rows(tree, mesh), stats


rollout_chunk = jit_with_model(rollout, static_argnames=("plan", "chunk_roots", "sampling", "pad_id", "mesh"))
rollout_chunk.__doc__ = "`rollout` compiled once per (model graph, shapes, plan, chunk size, sampling, mesh)."


def place_chunks(chunks: list[Chunk], num_roots: int, num_cont: int, pad_id: int) -> Tree:
    """The step's tree [M + M*N] from its chunks: each chunk's slots where the whole step has them."""
    s = num_roots * (1 + num_cont)
    rows, parts = [], []
    for c in chunks:
        r = c.tree.num_slots // (1 + num_cont)
        local = np.arange(c.tree.num_slots)
        at = np.where(local < c.end_root - c.first_root, c.first_root + local,
                      np.where((local >= r) & (local < r + c.conts), num_roots + c.first_cont + local - r, s))
        keep = np.flatnonzero(at < s)
        parent = jnp.where(c.tree.parent == Tree.NO_PARENT, Tree.NO_PARENT, c.tree.parent + c.first_root)
        rows.append(at[keep])
        parts.append(jax.tree.map(lambda a, keep=keep: a[keep], dataclasses.replace(c.tree, parent=parent)))
    first = chunks[0].tree
    empty = Tree.empty(s, first.max_len, first.max_turns, pad_id)
    at = np.concatenate(rows)
    if len(np.unique(at)) != len(at):
        raise ValueError("chunks overlap: two chunks place a slot at the same index")
    return jax.tree.map(lambda e, *xs: e.at[at].set(jnp.concatenate(xs)), empty, *parts)


def combine_stats(chunks: list[Chunk]) -> dict[str, jax.Array]:
    """The step's expansion stats from its chunks' (sums; utilisation over all chunks' slot steps)."""
    total = {k: sum(c.stats[k] for c in chunks) for k in chunks[0].stats if k != "utilisation"}
    return dict(total, utilisation=total["live_tokens"] / jnp.maximum(total["slot_steps"], 1))


def expand_in_chunks(model: Policy, env: Any, pool: Pool, key: jax.Array, *, plan: Plan, chunk_slots: int,
                     sampling: SamplingConfig, pad_id: int, mesh: Mesh | None = None,
                     run_chunk: Callable = rollout_chunk) -> tuple[Tree, jax.Array, dict[str, jax.Array], list[Chunk]]:
    """`expand` in chunks of at most chunk_slots slots: (tree [S], pool_v [B], stats, chunks), the tree and
    pool_v those of `expand` under the same key (padding slots aside). run_chunk: `rollout_chunk` for a JAX
    environment, `rollout.host.rollout_host_chunk` for a host one."""
    r = check_chunk(plan, chunk_slots, data_parallel_size(mesh))
    prompt_of_slot, _, pool_v = allocate_roots(model, pool, key, plan=plan)
    chunks, first_cont = [], 0
    for lo, hi in chunk_bounds(to_host(prompt_of_slot), r):  # gathered when it spans processes
        tree, stats = run_chunk(model, env, pool, key, prompt_of_slot, lo, hi, first_cont, plan=plan,
                                chunk_roots=r, sampling=sampling, pad_id=pad_id, mesh=mesh)
        conts = int(to_host(tree.is_continuation.sum()))
        chunks.append(Chunk(tree, lo, hi, first_cont, conts, stats))
        first_cont += conts
    return place_chunks(chunks, plan.roots, plan.continuations, pad_id), pool_v, combine_stats(chunks), chunks
