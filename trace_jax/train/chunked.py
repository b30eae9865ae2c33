"""A training step whose budget does not fit memory at once: rollouts and gradients in chunks of whole prompts.

Stage 1 allocates over the whole pool; each chunk rolls out its prompts' roots and continuations
(`rollout.chunks`), then each chunk's tree goes through the loss forward and backward on its own, weighted by
its share of the step's policy tokens and predictor weight, and the gradients are summed: the update equals
the unchunked step's (`build_step`) under the same key, up to float rounding. At most chunk_slots slots hold
a KV cache, and at most chunk_slots rows go through the backward, at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from trace_jax.envs.base import JaxEnv
from trace_jax.objectives import node_targets
from trace_jax.rollout.chunks import Chunk, check_chunk, expand_in_chunks
from trace_jax.rollout.expand import Pool
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import constrain_rows, data_parallel_size
from trace_jax.train.step import StepSpec, TrainState, apply_update, tree_grads, tree_metrics


def loss_weights(tree: Tree) -> tuple[jax.Array, jax.Array]:
    """(policy tokens, predictor weight) of a tree: the denominators of its loss's two means."""
    return tree.policy_mask[:, 1:].sum(), node_targets(tree)[1].sum()


class ChunkedStep:
    """(state, env, pool, key) -> (state, metrics), as `build_step`'s, in chunks of at most chunk_slots slots.
    Each chunk shape compiles once; a step runs as many chunks as its prompts need (a host loop)."""

    def __init__(self, graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: StepSpec, chunk_slots: int):
        self.graphdef, self.spec, self.chunk_slots = graphdef, spec, chunk_slots
        check_chunk(spec.plan, chunk_slots, data_parallel_size(spec.mesh))

        def grads(params: nnx.State, ref_params: nnx.State | None, tree: Tree, policy_share: jax.Array,
                  predictor_share: jax.Array):
            tree = constrain_rows(tree, spec.mesh)
            return tree_grads(graphdef, spec, params, ref_params, tree, policy_share, predictor_share)

        def finish(state: TrainState, grads: nnx.State, loss: jax.Array, aux: dict[str, jax.Array], tree: Tree,
                   pool: Pool, pool_v: jax.Array, stats: dict[str, jax.Array]):
            new_state, skipped = apply_update(tx, state, grads, loss)
            return new_state, dict(tree_metrics(spec, tree, pool, pool_v, stats), **aux, loss=loss, skipped=skipped,
                                   grad_norm=optax.tree.norm(grads))

        self._grads = jax.jit(grads)
        self._weights = jax.jit(loss_weights)
        self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), donate_argnums=0)
        self._finish = jax.jit(finish, donate_argnums=0)

    def accumulate(self, params: nnx.State, ref_params: nnx.State | None, chunks: list[Chunk]
                   ) -> tuple[jax.Array, dict[str, jax.Array], nnx.State]:
        """(loss, aux, grads) of the whole step from its chunks' trees: each chunk's loss weighted by its share
        of the step's policy tokens and predictor weight, so they sum to the whole step's."""
        weights = [self._weights(c.tree) for c in chunks]
        tokens = jnp.maximum(sum(w[0] for w in weights), 1)
        reads = jnp.maximum(sum(w[1] for w in weights), 1.0)
        loss, aux, grads = 0.0, {}, None
        for c, (tok, read) in zip(chunks, weights):
            shares = (tok / tokens, read / reads)
            part, part_aux, part_grads = self._grads(params, ref_params, c.tree, *shares)
            grads = part_grads if grads is None else self._add(grads, part_grads)
            loss = loss + part
            for k, v in part_aux.items():
                if k in ("ratio_max_dev", "pack_overflow", "pack_needed"):  # over all chunks: the largest, any
                    aux[k] = jnp.maximum(aux.get(k, v), v)
                elif k == "update_positions":  # every chunk's forward feeds its own
                    aux[k] = aux.get(k, 0) + v
                else:
                    aux[k] = aux.get(k, 0.0) + (shares[1] if k == "predictor_loss" else shares[0]) * v
        return loss, aux, grads

    def update(self, state: TrainState, chunks: list[Chunk], tree: Tree, pool: Pool, pool_v: jax.Array,
               stats: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        """The update from a chunked expansion (`expand_in_chunks`), as `build_update`'s from the whole tree;
        `state` is donated."""
        loss, aux, grads = self.accumulate(state.params, state.ref_params, chunks)
        return self._finish(state, grads, loss, aux, tree, pool, pool_v, stats)

    def __call__(self, state: TrainState, env: JaxEnv, pool: Pool, key: jax.Array
                 ) -> tuple[TrainState, dict[str, jax.Array]]:
        spec = self.spec
        tree, pool_v, stats, chunks = expand_in_chunks(
            nnx.merge(self.graphdef, state.params), env, pool, key, plan=spec.plan, chunk_slots=self.chunk_slots,
            sampling=spec.sampling, pad_id=spec.pad_id, mesh=spec.mesh)
        return self.update(state, chunks, tree, pool, pool_v, stats)
