"""One compiled training iteration for JAX-native environments (purejaxrl style).

allocate -> roll out the tree -> predictor targets and tree advantages -> clipped policy loss +
predictor loss (+ optional KL) -> optax update, all in one `jax.jit` with the state donated.
A non-finite loss or gradient skips the update (params and optimizer state unchanged) and is
reported in the metrics.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from trace_jax.allocation import Allocator, root_slots
from trace_jax.envs.base import JaxEnv
from trace_jax.objectives import (advantages, calibration_report, effective_ratio, entropy, node_targets,
                                  policy_loss, predictor_loss)
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool, expand
from trace_jax.rollout.tree import Tree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    params: nnx.State  # policy + success head
    opt_state: Any
    ref_params: nnx.State | None  # frozen reference for the KL term (None when kl_coef == 0)
    step: jax.Array  # [] int32 updates attempted so far


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Everything static about a step: budgets, allocator, loss weights, sampling."""

    allocator: Allocator
    pool_size: int  # B
    roots: int  # M
    continuations: int  # N (0 for prefix-free allocators)
    sampling: SamplingConfig
    clip_eps: float
    kl_coef: float
    predictor_coef: float
    pad_id: int


def make_optimizer(learning_rate: float, max_grad_norm: float) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate))


def read_positions(tree: Tree) -> jax.Array:
    """[S, T+1] token position of each node's last token: the prompt's, then each turn's."""
    pos = jnp.concatenate([tree.prompt_len[:, None], tree.boundaries], axis=1) - 1
    return jnp.clip(pos, 0, tree.max_len - 1)


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log p(tokens[:, t+1] | ...) [S, L-1] from logits [S, L, V]."""
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]


def apply_update(tx: optax.GradientTransformation, state: TrainState, grads: nnx.State, loss: jax.Array
                 ) -> tuple[TrainState, jax.Array]:
    """(new state, skipped): the optax update, or no change at all when loss/grads are not finite."""
    finite = jnp.isfinite(loss) & jnp.all(jnp.asarray([jnp.isfinite(g).all() for g in jax.tree.leaves(grads)]))
    safe = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
    updates, opt_state = tx.update(safe, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    return dataclasses.replace(state, params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
                               step=state.step + 1), ~finite


def _allocation_fns(spec: StepSpec):
    def roots_fn(key, v):
        return root_slots(spec.allocator.roots(key, v, spec.roots), spec.roots)

    def prefix_fn(key, roots: Tree):
        m = jnp.zeros((spec.pool_size,), jnp.int32).at[jnp.where(roots.prompt >= 0, roots.prompt, spec.pool_size)].add(
            1, mode="drop")
        return spec.allocator.prefixes(key, roots, m, spec.continuations)

    return roots_fn, prefix_fn


def rollout_metrics(tree: Tree, pool: Pool, stats: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Cost and outcome counters of one expansion (the equal-cost accounting of every allocator)."""
    used = tree.prompt >= 0
    roots = used & (tree.parent < 0)
    conts = used & (tree.parent >= 0)
    # policy tokens generated in this step: after the prompt (roots) or after the anchor (forks)
    start = jnp.where(conts, tree.boundaries[jnp.maximum(tree.parent, 0), jnp.maximum(tree.branch_turn, 0)],
                      tree.prompt_len)
    generated = (tree.policy_mask & (jnp.arange(tree.max_len)[None] >= start[:, None])).sum(1) * used
    idx = jnp.arange(tree.success.shape[1])[None]
    new_turn_reads = (tree.success >= 0) & (idx >= 1) & (idx > tree.branch_turn[:, None] + 1)
    prompts_used = jnp.zeros(pool.lengths.shape, jnp.int32).at[
        jnp.where(used, tree.prompt, pool.lengths.shape[0])].add(1, mode="drop") > 0
    return {
        "reward": jnp.sum(tree.reward * used) / jnp.maximum(used.sum(), 1),
        "root_reward": jnp.sum(tree.reward * roots) / jnp.maximum(roots.sum(), 1),
        "effective_ratio": effective_ratio(tree),
        "leaves": used.sum(),
        "prompts": prompts_used.sum(),
        "continuations": conts.sum(),
        "generated_tokens": generated.sum(),
        "root_generated_tokens": jnp.sum(generated * roots),
        "tool_calls": jnp.sum(new_turn_reads & used[:, None]),
        "model_tokens": tree.model_tokens.sum() + pool.lengths.sum(),
        "utilisation": stats["utilisation"],
    }


def build_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: StepSpec):
    """The jitted step: (state, env, pool, key) -> (state, metrics). Compiles once per shapes."""
    roots_fn, prefix_fn = _allocation_fns(spec)

    def step(state: TrainState, env: JaxEnv, pool: Pool, key: jax.Array):
        model = nnx.merge(graphdef, state.params)
        tree, pool_v, stats = expand(model, env, pool, key, roots_fn, prefix_fn, spec.sampling, spec.pad_id)
        tree = jax.lax.stop_gradient(tree)
        targets, weight = node_targets(tree)
        adv = advantages(tree)
        mask = tree.policy_mask[:, 1:]
        ref_logp = None
        if state.ref_params is not None:
            ref_logp = token_logprobs(nnx.merge(graphdef, state.ref_params)(tree.tokens).logits, tree.tokens)

        def loss_fn(params):
            out = nnx.merge(graphdef, params)(tree.tokens)
            logp = token_logprobs(out.logits, tree.tokens)
            pg, aux = policy_loss(logp, tree.logprobs[:, 1:], mask, adv, spec.clip_eps, ref_logp, spec.kl_coef)
            pred = jnp.take_along_axis(out.success, read_positions(tree), axis=1)
            pred_loss = predictor_loss(pred, targets, weight)
            aux = dict(aux, policy_loss=pg, predictor_loss=pred_loss,
                       entropy=entropy(out.logits[:, :-1], mask))
            return pg + spec.predictor_coef * pred_loss, aux

        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        new_state, skipped = apply_update(tx, state, grads, loss)
        calib = calibration_report(jnp.clip(tree.success, 0.0, 1.0), targets, weight)
        metrics = dict(rollout_metrics(tree, pool, stats), **aux, **calib, loss=loss, skipped=skipped,
                       grad_norm=optax.tree.norm(grads), pool_v=pool_v.mean(),
                       adv_abs=jnp.sum(jnp.abs(adv) * (tree.prompt >= 0)) / jnp.maximum((tree.prompt >= 0).sum(), 1))
        return new_state, metrics

    return jax.jit(step, donate_argnums=0)
