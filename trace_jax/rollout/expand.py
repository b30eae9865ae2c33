"""Tree expansion with static budget shapes: stage 1 (root rollouts) and stage 2 (forks).

Stage 1 prefills every pool prompt once; that one forward gives the predictor's V~ for
allocation and the KV cache that root slots copy by gather (no prompt is prefilled twice).
Stage 2 forks each continuation slot from its anchor (parent root slot, branch turn) by copying
tokens and cache up to the anchor's boundary; the prefix is never recomputed, and the first
token's logits come from the hidden state saved at the boundary.

Slots: roots [0, M), continuations [M, M + M*N) (letters: see `rollout/tree.py`). What goes where
is the `allocation.Plan`'s answer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from trace_jax.allocation import Plan, one_episode_per_prompt
from trace_jax.envs.base import JaxEnv
from trace_jax.models.decode import Prefill, prefill
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import Rollout, SamplingConfig, TurnSpec, max_len, run_turns
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import constrain_rows
from trace_jax.validate import concrete


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Pool:
    """Candidate prompts of one step."""

    tokens: jax.Array  # [B, P] int32 right-padded
    lengths: jax.Array  # [B] int32
    question: jax.Array  # [B] int32 env question ids


def prefill_pool(model: Policy, pool: Pool) -> Prefill:
    """Every pool prompt through the model once: its cache row, first logits and V~."""
    return prefill(model, pool.tokens, pool.lengths, pool.tokens.shape[1])


def _check_slots(name: str, index: jax.Array, size: int) -> None:
    """Outside jit: every entry of a slot index [S] is a sentinel (-1) or in [0, size)."""
    index = concrete(index)
    if index is not None:
        bad = (index < -1) | (index >= size)
        if bad.any():
            raise ValueError(f"{name} has entries outside [-1, {size}): {index[bad][:5].tolist()}")


def start_roots(model: Policy, env: JaxEnv, pool: Pool, prefilled: Prefill, prompt_of_slot: jax.Array,
                keys: jax.Array, *, pad_id: int, slot_len: int | None = None) -> Rollout:
    """Root slots [M] at the start of their episodes, copying their prompt's prefilled cache row.

    prompt_of_slot [M]: pool index per slot, NO_PROMPT for unused; keys [M]; slot_len: L (default:
    the prompt width plus T full turns). `fed_positions` starts at the pool prefill's B x P positions.
    """
    _check_slots("prompt_of_slot", prompt_of_slot, pool.tokens.shape[0])
    spec = TurnSpec.of(env)
    m, width = prompt_of_slot.shape[0], pool.tokens.shape[1]
    length = max_len(width, spec) if slot_len is None else slot_len
    used = prompt_of_slot != Tree.NO_PROMPT
    src = jnp.maximum(prompt_of_slot, 0)
    prompt_len = jnp.where(used, pool.lengths[src], 0)
    tokens = jnp.full((m, length), pad_id, jnp.int32).at[:, :width].set(pool.tokens[src])
    empty = Tree.empty(m, length, spec.max_turns, pad_id)
    tree = dataclasses.replace(
        empty,
        tokens=jnp.where(jnp.arange(length) < prompt_len[:, None], tokens, pad_id),
        length=prompt_len,
        prompt_len=prompt_len,
        success=empty.success.at[:, 0].set(jnp.where(used, prefilled.success[src], Tree.NO_READING)),
        prompt=prompt_of_slot.astype(jnp.int32),
        question=pool.question[src].astype(jnp.int32),
        done=~used,
    )
    cache = prefilled.cache.take(src).pad_to(length)
    return Rollout(tree=tree, cache=cache.with_lengths(jnp.where(used, cache.lengths, 0)),
                   logits=prefilled.logits[src],
                   boundary_hidden=jnp.zeros((m, spec.max_turns, model.cfg.hidden_size), model.cfg.jnp_dtype),
                   env_state=env.reset(tree.question), keys=keys, decode_steps=jnp.zeros((), jnp.int32),
                   live_tokens=jnp.zeros((), jnp.int32), fed_positions=jnp.int32(pool.tokens.size))


def fork(model: Policy, env: JaxEnv, roots: Rollout, parent: jax.Array, branch_turn: jax.Array,
         keys: jax.Array, *, pad_id: int) -> Rollout:
    """Continuation slots restarting after turn `branch_turn` [C] of root slot `parent` [C].

    Tokens, masks, log-probs, readings and the KV cache are copied up to the anchor's boundary
    (gather by index); the first token's logits come from the saved boundary hidden state.
    parent == NO_PARENT marks an unused slot (inert: done, NO_PROMPT, empty).
    """
    _check_slots("parent", parent, roots.tree.num_slots)
    used = parent != Tree.NO_PARENT
    src, b = jnp.maximum(parent, 0), jnp.maximum(branch_turn, 0)
    rt = roots.tree
    p, t, turns = concrete(parent), concrete(branch_turn), concrete(rt.num_turns)
    if p is not None and t is not None and turns is not None:
        ok = (p == Tree.NO_PARENT) | ((t >= 0) & (t < turns[np.maximum(p, 0)] - 1))
        if not ok.all():
            raise ValueError("branch_turn must name a non-final turn of the parent's episode; bad "
                             f"(parent, turn): {list(zip(p[~ok].tolist(), t[~ok].tolist()))[:5]}")
    cut = jnp.where(used, rt.boundaries[src, b], 0)  # [C] prefix length
    keep = jnp.arange(rt.max_len) < cut[:, None]
    before = jnp.arange(rt.max_turns) <= b[:, None]  # [C, T] turns copied from the parent
    empty = Tree.empty(parent.shape[0], rt.max_len, rt.max_turns, pad_id)
    tree = dataclasses.replace(
        empty,
        tokens=jnp.where(keep, rt.tokens[src], pad_id),
        policy_mask=keep & rt.policy_mask[src],
        logprobs=jnp.where(keep, rt.logprobs[src], 0.0),
        length=cut,
        prompt_len=jnp.where(used, rt.prompt_len[src], 0),
        boundaries=jnp.where(used[:, None] & before, rt.boundaries[src], Tree.NO_TURN),
        success=jnp.where(used[:, None] & (jnp.arange(rt.max_turns + 1) <= b[:, None] + 1), rt.success[src],
                          Tree.NO_READING),
        num_turns=jnp.where(used, b + 1, 0),
        prompt=jnp.where(used, rt.prompt[src], Tree.NO_PROMPT),
        question=rt.question[src],
        parent=jnp.where(used, parent, Tree.NO_PARENT).astype(jnp.int32),
        branch_turn=jnp.where(used, branch_turn, Tree.NO_TURN).astype(jnp.int32),
        done=~used,
    )
    return Rollout(
        tree=tree,
        cache=roots.cache.take(src).with_lengths(cut),
        logits=model.logits_from_hidden(roots.boundary_hidden[src, b]),
        boundary_hidden=jnp.where(before[..., None], roots.boundary_hidden[src], 0),
        env_state=env.at_turn(jax.tree.map(lambda a: a[src], roots.env_state), b + 1),
        keys=keys,
        decode_steps=jnp.zeros((), jnp.int32),
        live_tokens=jnp.zeros((), jnp.int32),
        fed_positions=jnp.zeros((), jnp.int32),
    )


def restart(model: Policy, env: JaxEnv, roots: Rollout, parent: jax.Array, branch_turn: jax.Array,
            keys: jax.Array, *, width: int, pad_id: int) -> Rollout:
    """What `fork` avoids: the same continuations, each prefix prefilled from scratch as a prompt.

    Slot i restarts after turn branch_turn[i] of root parent[i] (all >= 0); width: static prefix
    width >= every prefix length. Slots have the roots' length L, as forks do. With the same keys it
    samples what `fork` samples (the baseline of `trace-jax bench sampler`). The prefill's rows x
    width positions start its `fed_positions`.
    """
    rt = roots.tree
    cut = rt.boundaries[parent, branch_turn]
    prefix = jnp.where(jnp.arange(width) < cut[:, None], rt.tokens[parent, :width], pad_id)
    pool = Pool(tokens=prefix, lengths=cut, question=rt.question[parent])
    ro = start_roots(model, env, pool, prefill_pool(model, pool), jnp.arange(parent.shape[0], dtype=jnp.int32),
                     keys, pad_id=pad_id, slot_len=rt.max_len)
    turns = branch_turn + 1
    return dataclasses.replace(ro, tree=dataclasses.replace(ro.tree, num_turns=turns),
                               env_state=env.at_turn(ro.env_state, turns))


def concat(a: Tree, b: Tree) -> Tree:
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y]), a, b)


def start_stage1(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, *, plan: Plan, pad_id: int
                 ) -> tuple[Rollout, jax.Array, jax.Array]:
    """Prefill the pool, allocate roots (stage 1) and start them: (roots, pool_v [B], m [B]).
    `key` is the step's key; its split is shared with `start_stage2`."""
    k_roots, _, k_root_slots, _ = jax.random.split(key, 4)
    pre = prefill_pool(model, pool)
    prompt_of_slot, m = plan.root_slots(k_roots, pre.success)
    ro = start_roots(model, env, pool, pre, prompt_of_slot, jax.random.split(k_root_slots, plan.roots), pad_id=pad_id)
    return ro, pre.success, m


def start_stage2(model: Policy, env: JaxEnv, roots: Rollout, m: jax.Array, key: jax.Array, *, plan: Plan,
                 pad_id: int) -> tuple[Rollout, jax.Array]:
    """Allocate anchors among the finished roots (stage 2) and fork them: (continuations, unplaced [])."""
    _, k_prefix, _, k_cont_slots = jax.random.split(key, 4)
    parent, branch_turn, unplaced = plan.continuation_slots(k_prefix, roots.tree, m)
    cont = fork(model, env, roots, parent, branch_turn, jax.random.split(k_cont_slots, parent.shape[0]),
                pad_id=pad_id)
    return cont, unplaced


def join_phases(phases: list[Rollout], unplaced: jax.Array) -> tuple[Tree, dict[str, jax.Array]]:
    """The tree of the finished roots (and continuations) and the expansion's stats (see `expand`)."""
    tree = phases[0].tree if len(phases) == 1 else concat(phases[0].tree, phases[1].tree)
    capacity = sum(p.tree.num_slots * p.decode_steps for p in phases)
    stats = {"utilisation": sum(p.live_tokens for p in phases) / jnp.maximum(capacity, 1),
             "decode_steps": sum(p.decode_steps for p in phases),
             "live_tokens": sum(p.live_tokens for p in phases),
             "fed_positions": sum(p.fed_positions for p in phases),
             "slot_steps": capacity,
             "stage2_unplaced": unplaced}
    return tree, stats


def expand(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, *, plan: Plan, sampling: SamplingConfig,
           pad_id: int, mesh: Mesh | None = None) -> tuple[Tree, jax.Array, dict[str, jax.Array]]:
    """One step's rollout tree: allocate roots, roll them out, allocate anchors, fork and roll out.
    mesh: the slots (tree rows, KV cache, env state) are split over its data axes (`sharding.constrain_rows`),
    so each device rolls out its share; the sampled tree is the same as without a mesh.

    Returns (tree [S], pool_v [B]: the predictor's read of every pool prompt, stats):
      utilisation: decode steps that produced a live token over slot_steps, slots x decode loop steps;
      fed_positions: rows x positions of every forward (pool prefill, decode steps, observations),
        padding and idle slots included; useful positions are the pool's prompt tokens plus
        `tree.model_tokens`;
      stage2_unplaced: continuation budget the allocator could not place (no anchor, or capped).
    """
    ro, pool_v, m = start_stage1(model, env, pool, key, plan=plan, pad_id=pad_id)
    phases = [run_turns(model, env, constrain_rows(ro, mesh), sampling=sampling)]
    unplaced = jnp.zeros((), jnp.int32)
    if plan.continuations:
        cont, unplaced = start_stage2(model, env, phases[0], m, key, plan=plan, pad_id=pad_id)
        phases.append(run_turns(model, env, constrain_rows(cont, mesh), sampling=sampling))
    tree, stats = join_phases(phases, unplaced)
    return constrain_rows(tree, mesh), pool_v, stats


expand_tree = jit_with_model(expand, static_argnames=("plan", "sampling", "pad_id", "mesh"))
expand_tree.__doc__ = "`expand` compiled once per (model graph, shapes, plan, sampling, mesh)."


def rollout_prompts(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, *, sampling: SamplingConfig,
                    pad_id: int, mesh: Mesh | None = None) -> Tree:
    """One episode per pool prompt, no branching (evaluation and baselines)."""
    plan = one_episode_per_prompt(pool.tokens.shape[0])
    return expand_tree(model, env, pool, key, plan=plan, sampling=sampling, pad_id=pad_id, mesh=mesh)[0]
