"""How a step's expansion runs on the devices: whole, in chunks of whole prompts, or on fewer rows refilled
between turns; with the environment in JAX or on the host. Each gives the same tree under the same key."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from trace_jax.allocation import Plan
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.chunks import Chunk, expand_in_chunks, rollout_chunk, runs_in_chunks
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool, expand_tree
from trace_jax.rollout.host import expand_host, expand_host_refilled, rollout_host_chunk
from trace_jax.rollout.refill import expand_refilled, runs_refilled
from trace_jax.rollout.tree import Tree


def expand_scheduled(model: Policy, env: Any, pool: Pool, key: jax.Array, *, plan: Plan, sampling: SamplingConfig,
                     pad_id: int, host: bool = False, chunk_slots: int = 0, live_slots: int = 0,
                     mesh: Mesh | None = None) -> tuple[Tree, jax.Array, dict[str, jax.Array], list[Chunk] | None]:
    """(tree [S], pool_v [B], stats, chunks) of `expand` for `plan`: in chunks of at most chunk_slots slots
    where the plan's M * (1 + N) slots exceed them (`expand_in_chunks`; chunks: its `Chunk`s, else None), else on
    live_slots rows refilled between turns where they are fewer (`rollout.refill`), else whole. host: `env` is
    a `HostEnv`, answered on the host between turns (`rollout.host`), else a `JaxEnv` inside the program."""
    kwargs = dict(plan=plan, sampling=sampling, pad_id=pad_id, mesh=mesh)
    if runs_in_chunks(plan, chunk_slots):
        return expand_in_chunks(model, env, pool, key, chunk_slots=chunk_slots,
                                run_chunk=rollout_host_chunk if host else rollout_chunk, **kwargs)
    if runs_refilled(plan, live_slots):
        refilled = expand_host_refilled if host else expand_refilled
        return (*refilled(model, env, pool, key, live_slots=live_slots, **kwargs), None)
    return (*(expand_host if host else expand_tree)(model, env, pool, key, **kwargs), None)
