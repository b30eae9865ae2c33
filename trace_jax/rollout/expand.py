"""Tree expansion with static budget shapes: stage 1 (root rollouts) and stage 2 (forks).

Stage 1 prefills every pool prompt once; that one forward gives the predictor's V~ for
allocation and the KV cache that root slots copy by gather (no prompt is prefilled twice).
Stage 2 forks each continuation slot from its anchor (parent root slot, branch turn) by copying
tokens and cache up to the anchor's boundary; the prefix is never recomputed, and the first
token's logits come from the hidden state saved at the boundary.

Slots: roots [0, M), continuations [M, M + M*N); `Tree.prompt` is the pool index, -1 unused.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trace_jax.envs.base import JaxEnv
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import Rollout, SamplingConfig, TurnSpec, max_len, prefill, run_turns
from trace_jax.rollout.tree import NO_READING, Tree

RootFn = Callable[[jax.Array, jax.Array], jax.Array]  # (key, v_pool [B]) -> prompt_of_slot [M]
PrefixFn = Callable[[jax.Array, Tree], tuple[jax.Array, jax.Array]]  # -> parent, branch_turn [C]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Pool:
    """Candidate prompts of one step: tokens [B, P] right-padded, lengths [B], env question ids [B]."""

    tokens: jax.Array
    lengths: jax.Array
    question: jax.Array


def _concrete(*arrays: jax.Array) -> bool:
    """True when every array has a value now (eager call), so it can be validated on the host."""
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def _check_slots(name: str, index: jax.Array, size: int) -> None:
    if _concrete(index):
        index = np.asarray(index)
        bad = (index < -1) | (index >= size)
        if bad.any():
            raise ValueError(f"{name} has entries outside [-1, {size}): {index[bad][:5].tolist()}")


def start_roots(model: Policy, env: JaxEnv, pool: Pool, prompt_of_slot: jax.Array, keys: jax.Array,
                pool_cache, pool_logits: jax.Array, pool_v: jax.Array, pad_id: int) -> Rollout:
    """Root slots at the start of their episodes, copying their prompt's prefilled cache row."""
    _check_slots("prompt_of_slot", prompt_of_slot, pool.tokens.shape[0])
    spec = TurnSpec.of(env)
    m, width = prompt_of_slot.shape[0], pool.tokens.shape[1]
    length = max_len(width, spec)
    used = prompt_of_slot >= 0
    src = jnp.maximum(prompt_of_slot, 0)
    prompt_len = jnp.where(used, pool.lengths[src], 0)
    tokens = jnp.full((m, length), pad_id, jnp.int32).at[:, :width].set(pool.tokens[src])
    tokens = jnp.where(jnp.arange(length) < prompt_len[:, None], tokens, pad_id)
    tree = Tree(
        tokens=tokens,
        policy_mask=jnp.zeros((m, length), bool),
        logprobs=jnp.zeros((m, length), jnp.float32),
        length=prompt_len,
        prompt_len=prompt_len,
        boundaries=jnp.full((m, spec.max_turns), -1, jnp.int32),
        success=jnp.full((m, spec.max_turns + 1), NO_READING, jnp.float32).at[:, 0].set(
            jnp.where(used, pool_v[src], NO_READING)),
        num_turns=jnp.zeros((m,), jnp.int32),
        prompt=prompt_of_slot.astype(jnp.int32),
        question=pool.question[src].astype(jnp.int32),
        parent=jnp.full((m,), -1, jnp.int32),
        branch_turn=jnp.full((m,), -1, jnp.int32),
        done=~used,
        reward=jnp.zeros((m,), jnp.float32),
        model_tokens=jnp.zeros((m,), jnp.int32),
    )
    cache = pool_cache.take(src).pad_to(length)
    cache = cache.with_lengths(jnp.where(used, cache.lengths, 0))
    return Rollout(tree=tree, cache=cache, logits=pool_logits[src],
                   boundary_hidden=jnp.zeros((m, spec.max_turns, model.cfg.hidden_size), model.cfg.jnp_dtype),
                   env_state=env.reset(tree.question), keys=keys, decode_steps=jnp.zeros((), jnp.int32),
                   live_tokens=jnp.zeros((), jnp.int32))


def fork(env: JaxEnv, model: Policy, roots: Rollout, parent: jax.Array, branch_turn: jax.Array,
         keys: jax.Array, pad_id: int) -> Rollout:
    """Continuation slots restarting after turn `branch_turn` [C] of root slot `parent` [C].

    Tokens, masks, log-probs, readings and the KV cache are copied up to the anchor's boundary
    (gather by index); the first token's logits come from the saved boundary hidden state.
    parent == -1 marks an unused slot (inert: done, prompt -1, empty).
    """
    _check_slots("parent", parent, roots.tree.num_slots)
    used = parent >= 0
    src, b = jnp.maximum(parent, 0), jnp.maximum(branch_turn, 0)
    rt = roots.tree
    if _concrete(parent, branch_turn, rt.num_turns):
        p, t, turns = np.asarray(parent), np.asarray(branch_turn), np.asarray(rt.num_turns)
        ok = (p < 0) | ((t >= 0) & (t < turns[np.maximum(p, 0)] - 1))
        if not ok.all():
            raise ValueError("branch_turn must name a non-final turn of the parent's episode; bad "
                             f"(parent, turn): {list(zip(p[~ok].tolist(), t[~ok].tolist()))[:5]}")
    cut = jnp.where(used, rt.boundaries[src, b], 0)  # [C] prefix length
    keep = jnp.arange(rt.max_len) < cut[:, None]
    turns = rt.boundaries.shape[1]
    tree = Tree(
        tokens=jnp.where(keep, rt.tokens[src], pad_id),
        policy_mask=keep & rt.policy_mask[src],
        logprobs=jnp.where(keep, rt.logprobs[src], 0.0),
        length=cut,
        prompt_len=jnp.where(used, rt.prompt_len[src], 0),
        boundaries=jnp.where(used[:, None] & (jnp.arange(turns) <= b[:, None]), rt.boundaries[src], -1),
        success=jnp.where(used[:, None] & (jnp.arange(turns + 1) <= b[:, None] + 1), rt.success[src],
                          NO_READING),
        num_turns=jnp.where(used, b + 1, 0),
        prompt=jnp.where(used, rt.prompt[src], -1),
        question=rt.question[src],
        parent=jnp.where(used, parent, -1).astype(jnp.int32),
        branch_turn=jnp.where(used, branch_turn, -1).astype(jnp.int32),
        done=~used,
        reward=jnp.zeros(parent.shape, jnp.float32),
        model_tokens=jnp.zeros(parent.shape, jnp.int32),
    )
    hidden = roots.boundary_hidden[src, b]  # [C, D]
    logits = model.logits_from_hidden(hidden[:, None])[:, 0]
    return Rollout(
        tree=tree,
        cache=roots.cache.take(src).with_lengths(cut),
        logits=logits,
        boundary_hidden=jnp.where(
            (jnp.arange(turns) <= b[:, None])[..., None], roots.boundary_hidden[src], 0),
        env_state=env.at_turn(jax.tree.map(lambda a: a[src], roots.env_state), b + 1),
        keys=keys,
        decode_steps=jnp.zeros((), jnp.int32),
        live_tokens=jnp.zeros((), jnp.int32),
    )


def restart(env: JaxEnv, model: Policy, roots: Rollout, parent: jax.Array, branch_turn: jax.Array,
            keys: jax.Array, width: int, pad_id: int) -> Rollout:
    """What `fork` avoids: the same continuations, each prefix prefilled from scratch as a prompt.

    Slot i restarts after turn branch_turn[i] of root parent[i] (all >= 0); width: static prefix
    width >= every prefix length. With the same keys it samples what `fork` samples (the baseline
    of `trace-jax bench sampler`, and the reference the fork test compares against).
    """
    rt = roots.tree
    cut = rt.boundaries[parent, branch_turn]
    prefix = jnp.where(jnp.arange(width) < cut[:, None], rt.tokens[parent, :width], pad_id)
    pool = Pool(tokens=prefix, lengths=cut, question=rt.question[parent])
    cache, logits, v = prefill(model, pool.tokens, pool.lengths, width)
    ro = start_roots(model, env, pool, jnp.arange(parent.shape[0], dtype=jnp.int32), keys, cache, logits, v,
                     pad_id)
    turns = branch_turn + 1
    return dataclasses.replace(ro, tree=dataclasses.replace(ro.tree, num_turns=turns),
                               env_state=env.at_turn(ro.env_state, turns))


def concat(a: Tree, b: Tree) -> Tree:
    return jax.tree.map(lambda x, y: jnp.concatenate([x, y]), a, b)


def expand(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, roots_fn: RootFn, prefix_fn: PrefixFn,
           sampling: SamplingConfig, pad_id: int) -> tuple[Tree, jax.Array, dict[str, jax.Array]]:
    """One step's rollout tree: allocate roots, roll them out, allocate anchors, fork and roll out.

    Returns (tree [M + C slots], pool_v [B]: the predictor's read of every pool prompt, stats).
    Token positions fed through the model: `tree.model_tokens` per slot plus the pool prefill,
    `pool.lengths.sum()`. stats["utilisation"]: decode steps that produced a live token over
    slots x decode loop steps.
    """
    k_roots, k_prefix, k_root_slots, k_cont_slots = jax.random.split(key, 4)
    cache, logits, pool_v = prefill(model, pool.tokens, pool.lengths, pool.tokens.shape[1])
    prompt_of_slot = roots_fn(k_roots, pool_v)
    m = prompt_of_slot.shape[0]
    ro = start_roots(model, env, pool, prompt_of_slot, jax.random.split(k_root_slots, m), cache, logits,
                     pool_v, pad_id)
    ro = run_turns(model, env, ro, sampling)
    parent, branch_turn = prefix_fn(k_prefix, ro.tree)
    phases = [ro]
    if parent.shape[0]:
        cont = fork(env, model, ro, parent, branch_turn, jax.random.split(k_cont_slots, parent.shape[0]), pad_id)
        phases.append(run_turns(model, env, cont, sampling))
    tree = phases[0].tree if len(phases) == 1 else concat(phases[0].tree, phases[1].tree)
    capacity = sum(p.tree.num_slots * p.decode_steps for p in phases)
    stats = {"utilisation": sum(p.live_tokens for p in phases) / jnp.maximum(capacity, 1),
             "decode_steps": sum(p.decode_steps for p in phases),
             "live_tokens": sum(p.live_tokens for p in phases)}
    return tree, pool_v, stats


@functools.partial(jax.jit, static_argnames=("graphdef", "roots_fn", "prefix_fn", "sampling", "pad_id"))
def _expand_jit(graphdef, state, env, pool, key, roots_fn, prefix_fn, sampling, pad_id):
    return expand(nnx.merge(graphdef, state), env, pool, key, roots_fn, prefix_fn, sampling, pad_id)


def expand_tree(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, roots_fn: RootFn, prefix_fn: PrefixFn,
                sampling: SamplingConfig, pad_id: int) -> tuple[Tree, jax.Array, dict[str, jax.Array]]:
    """`expand` compiled once per (model graph, shapes, allocation functions, sampling)."""
    graphdef, state = nnx.split(model)
    return _expand_jit(graphdef, state, env, pool, key, roots_fn, prefix_fn, sampling, pad_id)


def one_root_per_prompt(key: jax.Array, v: jax.Array) -> jax.Array:
    """Root allocation that gives every pool prompt exactly one slot (evaluation)."""
    del key
    return jnp.arange(v.shape[0], dtype=jnp.int32)


def no_prefixes(key: jax.Array, tree: Tree) -> tuple[jax.Array, jax.Array]:
    """Prefix allocation with no continuations."""
    del key, tree
    empty = jnp.zeros((0,), jnp.int32)
    return empty, empty


def rollout_prompts(model: Policy, env: JaxEnv, pool: Pool, key: jax.Array, sampling: SamplingConfig,
                    pad_id: int) -> Tree:
    """One episode per pool prompt, no branching (evaluation and baselines)."""
    return expand_tree(model, env, pool, key, one_root_per_prompt, no_prefixes, sampling, pad_id)[0]
