"""Tree expansion with the environment on the host (a retriever, a sandbox).

The same stages, slots and keys as `rollout.expand.expand`: stage 1, the roots' turns, stage 2, the
continuations' turns. The array work (prefill and allocation, forks, each turn's generation and
observation) is compiled once per shapes; between turns the host answers every live slot in one
`HostEnv.step` call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from trace_jax.allocation import Plan
from trace_jax.envs.base import HostEnv
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout import refill
from trace_jax.rollout.chunks import fork_chunk, start_chunk
from trace_jax.rollout.engine import SamplingConfig, TurnSpec, host_turn_fns, play_turn_host, run_turns_host
from trace_jax.rollout.expand import Pool, join_phases, start_stage1, start_stage2
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import constrain_rows, to_host


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NoEnvState:
    """What the stages' array code needs of an environment that lives on the host: its turn shapes.
    Episodes carry no device state (the host reads question and turn from the tree)."""

    max_turns: int = dataclasses.field(metadata=dict(static=True))
    action_len: int = dataclasses.field(metadata=dict(static=True))
    obs_len: int = dataclasses.field(metadata=dict(static=True))
    stop_ids: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    stop_sequences: tuple[tuple[int, ...], ...] = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def of(cls, env: HostEnv) -> NoEnvState:
        spec = TurnSpec.of(env)
        return cls(spec.max_turns, spec.action_len, spec.obs_len, spec.stop_ids, spec.stop_sequences)

    def reset(self, question: jax.Array) -> jax.Array:
        return jnp.zeros_like(question)

    def at_turn(self, state: jax.Array, turns: jax.Array) -> jax.Array:
        return jnp.zeros_like(turns)


def _on_mesh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn with its outputs' rows split over `mesh` (a keyword; None: as they come), so that every array the host
    loop passes on lives on the mesh's devices."""
    @functools.wraps(fn)
    def split(*args: Any, mesh: Mesh | None = None, **kwargs: Any) -> Any:
        return constrain_rows(fn(*args, **kwargs), mesh)

    return split


_stage1 = jit_with_model(_on_mesh(start_stage1), static_argnames=("plan", "pad_id", "mesh"))
_stage2 = jit_with_model(_on_mesh(start_stage2), static_argnames=("plan", "pad_id", "mesh"))
_start_chunk = jit_with_model(_on_mesh(start_chunk), static_argnames=("plan", "chunk_roots", "pad_id", "mesh"))
_fork_chunk = jit_with_model(_on_mesh(fork_chunk), static_argnames=("plan", "pad_id", "mesh"))
_join = jax.jit(join_phases)


def _live_on_mesh(fn: Callable[..., tuple[refill.Work, Any] | refill.Work]) -> Callable[..., Any]:
    """fn returning `Work` (alone or first), with the work's live rows split over `mesh` (a keyword)."""
    @functools.wraps(fn)
    def split(*args: Any, mesh: Mesh | None = None, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        w, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        w = dataclasses.replace(w, live=constrain_rows(w.live, mesh))
        return w if rest is None else (w, *rest)

    return split


_refill_start = jit_with_model(_live_on_mesh(refill.start), static_argnames=("plan", "live_slots", "pad_id", "mesh"))
_refill_settle = jit_with_model(_live_on_mesh(refill.settle), static_argnames=("plan", "pad_id", "mesh"))
_refill_finish = jax.jit(refill.finish)


def expand_host(model: Policy, env: HostEnv, pool: Pool, key: jax.Array, *, plan: Plan, sampling: SamplingConfig,
                pad_id: int, mesh: Mesh | None = None) -> tuple[Tree, jax.Array, dict[str, jax.Array]]:
    """`expand` with `env` on the host: (tree [S], pool_v [B], stats), equal to `expand` of the same
    environment written in JAX under the same key. mesh: each turn's slots are split over its data axes."""
    shape = NoEnvState.of(env)
    generate, append = host_turn_fns(model, TurnSpec.of(env), sampling, mesh)
    ro, pool_v, m = _stage1(model, shape, pool, key, plan=plan, pad_id=pad_id, mesh=mesh)
    phases = [run_turns_host(generate, append, env, ro)]
    unplaced = jnp.zeros((), jnp.int32)
    if plan.continuations:
        cont, unplaced = _stage2(model, shape, phases[0], m, key, plan=plan, pad_id=pad_id, mesh=mesh)
        phases.append(run_turns_host(generate, append, env, cont))
    tree, stats = _join(phases, unplaced)
    return tree, pool_v, stats


def rollout_host_chunk(model: Policy, env: HostEnv, pool: Pool, key: jax.Array, prompt_of_slot: jax.Array,
                       first_root: int, end_root: int, first_cont: int, *, plan: Plan, chunk_roots: int,
                       sampling: SamplingConfig, pad_id: int, mesh: Mesh | None = None
                       ) -> tuple[Tree, dict[str, jax.Array]]:
    """`rollout.chunks.rollout` with `env` on the host (the `run_chunk` of `expand_in_chunks`): the chunk's roots
    and their continuations, the same tree as the JAX environment's chunk. mesh: each turn's slots are split
    over its data axes."""
    shape = NoEnvState.of(env)
    generate, append = host_turn_fns(model, TurnSpec.of(env), sampling, mesh)
    ro, m = _start_chunk(model, shape, pool, key, prompt_of_slot, first_root, end_root, plan=plan,
                         chunk_roots=chunk_roots, pad_id=pad_id, mesh=mesh)
    phases = [run_turns_host(generate, append, env, ro)]
    unplaced = jnp.zeros((), jnp.int32)
    if plan.continuations:
        cont, unplaced = _fork_chunk(model, shape, phases[0], m, key, first_root, first_cont, plan=plan,
                                     pad_id=pad_id, mesh=mesh)
        phases.append(run_turns_host(generate, append, env, cont))
    return _join(phases, unplaced)


def expand_host_refilled(model: Policy, env: HostEnv, pool: Pool, key: jax.Array, *, plan: Plan,
                         sampling: SamplingConfig, pad_id: int, live_slots: int, mesh: Mesh | None = None
                         ) -> tuple[Tree, jax.Array, dict[str, jax.Array]]:
    """`rollout.refill.expand` with `env` on the host: each turn the host answers the live rows that run an
    episode, then the finished ones are written and refilled (`refill.settle`, compiled once). The same
    (tree [S], pool_v [B]) as `expand_host` under the same key."""
    shape = NoEnvState.of(env)
    generate, append = host_turn_fns(model, TurnSpec.of(env), sampling, mesh)
    w, pool_v = _refill_start(model, shape, pool, key, plan=plan, live_slots=live_slots, pad_id=pad_id, mesh=mesh)
    while (to_host(w.item) != refill.NO_ITEM).any():
        w = dataclasses.replace(w, live=play_turn_host(generate, append, env, w.live))
        w = _refill_settle(model, shape, w, plan=plan, pad_id=pad_id, mesh=mesh)
    tree, stats = _refill_finish(w)
    return tree, pool_v, stats
