"""The training step behind one interface, (state, env, pool, key) -> (state, metrics), built for the environment's
kind: a `JaxEnv` rolls out inside the compiled step (`step.build_step`, or `chunked.ChunkedStep` in chunks), a
`HostEnv` is answered on the host between compiled turns and the update runs compiled alone (`HostStep`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import optax
from flax import nnx

from trace_jax.envs.base import HostEnv, JaxEnv
from trace_jax.rollout.chunks import runs_in_chunks
from trace_jax.rollout.expand import Pool
from trace_jax.rollout.schedule import expand_scheduled
from trace_jax.train.chunked import ChunkedStep
from trace_jax.train.step import StepSpec, TrainState, build_step, build_update

Step = Callable[[TrainState, JaxEnv | HostEnv, Pool, jax.Array], tuple[TrainState, dict[str, jax.Array]]]


class HostStep:
    """The step of a host environment: the tree expanded with host turns (`rollout.schedule.expand_scheduled`:
    whole, in chunks of chunk_slots or on refilled rows), then the update compiled alone, from the whole tree or
    chunk by chunk. Its metrics add `rollout_seconds`, the expansion's wall time."""

    def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: StepSpec, chunk_slots: int):
        self.graphdef, self.spec, self.chunk_slots = graphdef, spec, chunk_slots
        self.update = build_update(graphdef, tx, spec)
        self.chunked = ChunkedStep(graphdef, tx, spec, chunk_slots) if runs_in_chunks(spec.plan, chunk_slots) else None

    def __call__(self, state: TrainState, env: HostEnv, pool: Pool, key: jax.Array
                 ) -> tuple[TrainState, dict[str, jax.Array | float]]:
        spec, t0 = self.spec, time.perf_counter()
        tree, pool_v, stats, chunks = expand_scheduled(
            nnx.merge(self.graphdef, state.params), env, pool, key, plan=spec.plan, sampling=spec.sampling,
            pad_id=spec.pad_id, host=True, chunk_slots=self.chunk_slots, live_slots=spec.refill_slots, mesh=spec.mesh)
        rollout_seconds = time.perf_counter() - t0
        if self.chunked is None:
            state, metrics = self.update(state, tree, pool, pool_v, stats)
        else:
            state, metrics = self.chunked.update(state, chunks, tree, pool, pool_v, stats)
        return state, {**metrics, "rollout_seconds": rollout_seconds}


@functools.lru_cache(maxsize=8)
def make_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: StepSpec, chunk_slots: int = 0,
              host: bool = False) -> Step:
    """The training step of `spec`: for a host environment a `HostStep`; else `build_step` (one jitted program),
    or a `ChunkedStep` when chunk_slots is set and smaller than the step's M * (1 + N) slots. Built once per process
    for equal arguments (graphdefs compare by structure; `make_optimizer` returns one object per setting), so the
    runs of a comparison (its seeds, the equal-cost probe of a prefix-free method, a resumed run) trace and compile
    each step once."""
    if host:
        return HostStep(graphdef, tx, spec, chunk_slots)
    if runs_in_chunks(spec.plan, chunk_slots):
        return ChunkedStep(graphdef, tx, spec, chunk_slots)
    return build_step(graphdef, tx, spec)
