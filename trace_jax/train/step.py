"""One compiled training iteration for JAX-native environments (purejaxrl style).

allocate -> roll out the tree -> predictor targets and tree advantages -> clipped policy loss +
predictor loss (+ optional KL) -> optax update, all in one `jax.jit` with the state donated.
With a host environment the rollout runs outside (`rollout.host`) and the rest is one `jax.jit`
(`build_update`), the same code.
A non-finite loss or gradient skips the update (params and optimizer state unchanged) and is
reported in the metrics.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from trace_jax.allocation import Plan, anchor_groups
from trace_jax.envs.base import JaxEnv
from trace_jax.models.qwen3 import Policy
from trace_jax.objectives import (
    TokenWeights,
    advantages,
    calibration_report,
    entropy,
    node_targets,
    predictor_loss,
    predictor_report,
    solve_rates,
    weighted_policy_loss,
)
from trace_jax.rollout import refill
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool, expand
from trace_jax.rollout.sampling import policy_logprobs, token_logprobs
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import constrain_rows, constrain_vocab
from trace_jax.train.packing import Packed, auto_row_len, pack


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    params: nnx.State  # policy + success head
    opt_state: Any
    ref_params: nnx.State | None  # frozen reference for the KL term (None when kl_coef == 0)
    step: jax.Array  # [] int32 updates attempted so far


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Everything static about a step: allocation plan (allocator and budgets), loss weights, sampling.

    The trainer scores tokens under the sampling temperature, the distribution they were drawn from.
    """

    plan: Plan
    sampling: SamplingConfig
    clip_eps: float
    kl_coef: float
    predictor_coef: float
    pad_id: int
    predictor_backbone_grad: bool = False  # False: the predictor loss trains the predictor only (head, own layers)
    mesh: Mesh | None = None  # slots (rollout and update rows) split over its data axes; None: not constrained
    remat: bool = False  # the loss forward through `Policy.remat_layers`: the same values, far less saved
    pack_rows: int = 0  # R: the loss feeds each distinct token of the tree once, in R rows (`train.packing`); 0: off
    pack_len: int = 0  # Lp: positions per packed row (a prompt's whole tree must fit one); 0: `auto_row_len`
    pack_block: int = 16  # Bk: positions per block of a packed row (each slot's tokens start one; Lp a multiple)
    refill_slots: int = 0  # S_live: the rollout runs on this many rows, refilled between turns (`rollout.refill`)

    def __post_init__(self) -> None:
        if self.refill_slots < 0:
            raise ValueError(f"refill_slots must be >= 0 (0: synchronous turns), got {self.refill_slots}")
        if min(self.pack_rows, self.pack_len) < 0 or (self.pack_len > 0 and not self.pack_rows):
            raise ValueError(f"pack_rows={self.pack_rows} and pack_len={self.pack_len}: pack_rows > 0 packs the "
                             "update (pack_len > 0 or 0 for half the unpacked positions), pack_rows 0 does not")
        if self.pack_block < 1 or self.pack_len % self.pack_block:
            raise ValueError(f"pack_len={self.pack_len} must be a multiple of pack_block={self.pack_block} (>= 1): "
                             "rows are laid in whole blocks")


HEAD_PARAMS = ("success_kernel", "success_bias")  # the success head: a linear read of the predictor's hidden state
PREDICTOR_PARAMS = HEAD_PARAMS + ("predictor", "predictor_norm")  # the head and the predictor's own layers


def param_groups(params: nnx.State) -> nnx.State:
    """The optimizer group of each parameter: "head" for the success predictor (its head and own layers),
    "policy" for the rest."""
    def label(path, _) -> str:
        return "head" if any(getattr(p, "key", None) in PREDICTOR_PARAMS for p in path) else "policy"

    return jax.tree_util.tree_map_with_path(label, params)


@functools.cache  # the same object for the same settings: `steps.make_step` reuses a step built with it
def make_optimizer(learning_rate: float, max_grad_norm: float, head_learning_rate: float | None = None
                   ) -> optax.GradientTransformation:
    """Adam with global-norm clipping, per group: the policy at learning_rate, the success head at
    head_learning_rate (default: learning_rate), each clipped on its own so neither scales the other."""
    def group(lr: float) -> optax.GradientTransformation:
        return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(lr))

    return optax.multi_transform({"policy": group(learning_rate), "head": group(head_learning_rate or learning_rate)},
                                 param_groups)


def apply_update(tx: optax.GradientTransformation, state: TrainState, grads: nnx.State, loss: jax.Array
                 ) -> tuple[TrainState, jax.Array]:
    """(new state, skipped): the optax update, or no change at all when loss/grads are not finite."""
    finite = jnp.isfinite(loss) & jnp.all(jnp.asarray([jnp.isfinite(g).all() for g in jax.tree.leaves(grads)]))
    safe = jax.tree.map(lambda g: jnp.where(finite, g, 0.0), grads)
    updates, opt_state = tx.update(safe, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    return dataclasses.replace(state, params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state),
                               step=state.step + 1), ~finite


def rollout_metrics(tree: Tree, pool: Pool, stats: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Cost and outcome counters of one expansion (the equal-cost accounting of every allocator)."""
    used, roots, conts = tree.used, tree.is_root, tree.is_continuation
    # policy tokens generated in this step: after the prompt (roots) or after the anchor (forks)
    generated = (tree.policy_mask & (jnp.arange(tree.max_len)[None] >= tree.start[:, None])).sum(1) * used
    idx = jnp.arange(tree.max_turns + 1)[None]
    new_turn_reads = tree.has_reading & (idx >= 1) & (idx > tree.branch_turn[:, None] + 1)
    prompts_used = jnp.zeros(pool.lengths.shape, jnp.int32).at[
        jnp.where(used, tree.prompt, pool.lengths.shape[0])].add(1, mode="drop") > 0
    rates = solve_rates(tree)  # solve_partial is the effective ratio
    return {
        **rates,
        "reward": jnp.sum(tree.reward * used) / jnp.maximum(used.sum(), 1),
        "root_reward": jnp.sum(tree.reward * roots) / jnp.maximum(roots.sum(), 1),
        "effective_ratio": rates["solve_partial"],
        "leaves": used.sum(),
        "prompts": prompts_used.sum(),
        "continuations": conts.sum(),
        "generated_tokens": generated.sum(),
        "root_generated_tokens": jnp.sum(generated * roots),
        "tool_calls": jnp.sum(new_turn_reads & used[:, None]),
        "model_tokens": tree.model_tokens.sum() + pool.lengths.sum(),
        "fed_positions": stats["fed_positions"],
        "stage2_unplaced": stats["stage2_unplaced"],
        "utilisation": stats["utilisation"],
    }


def allocation_counts(tree: Tree, num_pool: int, num_roots: int) -> dict[str, jax.Array]:
    """How one step spent its budget, as histograms: roots_per_prompt [M+1] (pool prompts given m root
    rollouts; m = 0: filtered out) and continuations_per_anchor [M*N+1] (valid anchors given k continuations)."""
    m = jnp.zeros(num_pool, jnp.int32).at[jnp.where(tree.is_root, tree.prompt, num_pool)].add(1, mode="drop")
    k = jnp.zeros((num_roots, tree.max_turns), jnp.int32).at[
        jnp.where(tree.is_continuation, tree.parent, num_roots), jnp.maximum(tree.branch_turn, 0)].add(1, mode="drop")
    valid, _ = anchor_groups(tree, num_roots)
    most = tree.num_slots - num_roots
    return {"roots_per_prompt": jnp.zeros(num_roots + 1, jnp.int32).at[m].add(1),
            "continuations_per_anchor": jnp.zeros(most + 1, jnp.int32).at[jnp.where(valid, k, most + 1)].add(
                1, mode="drop")}


@dataclasses.dataclass(frozen=True)
class UpdateBatch:
    """What the loss forward feeds and scores: the tree one row per slot, or its packing. Shapes [...] are the
    scored tokens'."""

    forward: Callable[[Policy], tuple[jax.Array, jax.Array]]  # -> (logits [..., V] scoring tokens, read hidden)
    tokens: jax.Array  # [...] int32 the scored tokens
    logp_old: jax.Array  # [...] float32 their sampling log-probabilities
    weights: TokenWeights  # [...] the policy-loss terms each carries


def unpacked_batch(spec: StepSpec, tree: Tree, adv: jax.Array) -> UpdateBatch:
    """Every slot's row, each token scored from the hidden state before it: [S, L-1] scored tokens."""
    def forward(policy: Policy) -> tuple[jax.Array, jax.Array]:
        out = policy(tree.tokens, remat=spec.remat, predictor_grad=spec.predictor_backbone_grad)
        logits = constrain_vocab(out.logits, spec.mesh)  # [S, L, V/tensor] per device
        return logits[:, :-1], jnp.take_along_axis(out.predictor_hidden, tree.read_positions()[..., None], axis=1)

    mask = tree.policy_mask[:, 1:]
    return UpdateBatch(forward, tree.tokens[:, 1:], tree.logprobs[:, 1:], TokenWeights.of_mask(mask, adv))


def packed_batch(spec: StepSpec, packed: Packed) -> UpdateBatch:
    """Each distinct token once (`train.packing`), scored from the hidden state of its slot's previous position's
    canonical copy: [R, Lp] scored tokens."""
    def forward(policy: Policy) -> tuple[jax.Array, jax.Array]:
        tokens, positions, paged = constrain_rows((packed.tokens, packed.positions, packed.paged), spec.mesh)
        out = policy(tokens, positions=positions, paged=paged, remat=spec.remat,
                     predictor_grad=spec.predictor_backbone_grad)
        flat = lambda h: h.reshape(-1, h.shape[-1])  # [R * Lp, D]
        logits = constrain_vocab(policy.logits_from_hidden(flat(out.hidden)[packed.prev]), spec.mesh)  # [R, Lp, V]
        return logits, flat(out.predictor_hidden)[packed.reads]

    return UpdateBatch(forward, packed.tokens, packed.logp_old, packed.weights)


def batch_grads(graphdef: nnx.GraphDef, spec: StepSpec, params: nnx.State, ref_params: nnx.State | None,
                batch: UpdateBatch, targets: jax.Array, weight: jax.Array, policy_share: jax.Array | float,
                predictor_share: jax.Array | float) -> tuple[jax.Array, dict[str, jax.Array], nnx.State]:
    """(loss, aux, grads) of `tree_grads` on a batch, the predictor's node targets and weight [S, T+1] given."""
    temperature = spec.sampling.temperature
    ref_logp = None
    if ref_params is not None:
        ref_logp = token_logprobs(batch.forward(nnx.merge(graphdef, ref_params))[0], batch.tokens, temperature)

    def loss_fn(params):
        policy = nnx.merge(graphdef, params)
        logits, read = batch.forward(policy)
        logp = token_logprobs(logits, batch.tokens, temperature)
        pg, aux = weighted_policy_loss(logp, batch.logp_old, batch.weights, spec.clip_eps, ref_logp, spec.kl_coef)
        pred = policy.success_from_hidden(read)
        pred_loss = predictor_loss(pred, targets, weight)
        aux = dict(aux, policy_loss=pg, predictor_loss=pred_loss,
                   entropy=entropy(policy_logprobs(logits, temperature), batch.weights.paths))
        return policy_share * pg + predictor_share * spec.predictor_coef * pred_loss, aux

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return loss, aux, grads


def tree_grads(graphdef: nnx.GraphDef, spec: StepSpec, params: nnx.State, ref_params: nnx.State | None, tree: Tree,
               policy_share: jax.Array | float = 1.0, predictor_share: jax.Array | float = 1.0
               ) -> tuple[jax.Array, dict[str, jax.Array], nnx.State]:
    """(loss, aux, grads) of the clipped policy loss + predictor loss (+ KL) on a finished tree.

    The token means of the policy terms are scaled by policy_share and the predictor's weighted mean by
    predictor_share: a chunk of whole prompts passes its share of the step's policy tokens and predictor
    weight, so the chunks' losses and gradients add up to the whole step's. aux holds the unscaled means.
    With spec.pack_rows the forward and backward run packed (`train.packing`), to the same values; a tree that
    does not fit the packing runs unpacked instead, in the same program. aux then also holds pack_overflow,
    update_positions, the rows x positions fed (R * Lp packed, S * L unpacked), and pack_needed, the positions
    the tree takes packed (what R * Lp must at least hold).
    """
    targets, weight = node_targets(tree)
    adv = advantages(tree)
    grads_of = functools.partial(batch_grads, graphdef, spec, params, ref_params, targets=targets, weight=weight,
                                 policy_share=policy_share, predictor_share=predictor_share)
    if not spec.pack_rows:
        return grads_of(unpacked_batch(spec, tree, adv))
    row_len = spec.pack_len or auto_row_len(tree.num_slots, tree.max_len, spec.pack_rows, spec.pack_block)
    packed = pack(tree, adv, spec.pack_rows, row_len, spec.pack_block)
    loss, aux, grads = jax.lax.cond(packed.overflow, lambda: grads_of(unpacked_batch(spec, tree, adv)),
                                    lambda: grads_of(packed_batch(spec, packed)))
    positions = jnp.where(packed.overflow, tree.tokens.size, packed.num_positions)
    return loss, dict(aux, pack_overflow=packed.overflow, update_positions=positions, pack_needed=packed.needed), grads


def tree_metrics(spec: StepSpec, tree: Tree, pool: Pool, pool_v: jax.Array, stats: dict[str, jax.Array]
                 ) -> dict[str, jax.Array]:
    """What a step logs about its tree, beside the loss terms: cost, outcomes, allocation, predictor quality."""
    targets, weight = node_targets(tree)
    calib = calibration_report(jnp.clip(tree.success, 0.0, 1.0), targets, weight)
    return dict(rollout_metrics(tree, pool, stats), **calib, **predictor_report(tree), pool_v=pool_v.mean(),
                pool_v_std=pool_v.std(), pool_v_values=pool_v,
                **allocation_counts(tree, pool.lengths.shape[0], spec.plan.roots),
                adv_abs=jnp.sum(jnp.abs(advantages(tree)) * tree.used) / jnp.maximum(tree.used.sum(), 1))


def update_from_tree(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: StepSpec, state: TrainState,
                     tree: Tree, pool: Pool, pool_v: jax.Array, stats: dict[str, jax.Array]
                     ) -> tuple[TrainState, dict[str, jax.Array]]:
    """Targets, advantages, loss and the optax update from a finished expansion: (state, metrics)."""
    tree = constrain_rows(jax.lax.stop_gradient(tree), spec.mesh)  # the loss forward: each device its rows
    loss, aux, grads = tree_grads(graphdef, spec, state.params, state.ref_params, tree)
    new_state, skipped = apply_update(tx, state, grads, loss)
    return new_state, dict(tree_metrics(spec, tree, pool, pool_v, stats), **aux, loss=loss, skipped=skipped,
                           grad_norm=optax.tree.norm(grads))


def build_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: StepSpec):
    """The jitted step: (state, env, pool, key) -> (state, metrics). Compiles once per shapes."""

    def step(state: TrainState, env: JaxEnv, pool: Pool, key: jax.Array):
        model = nnx.merge(graphdef, state.params)
        kwargs = dict(plan=spec.plan, sampling=spec.sampling, pad_id=spec.pad_id, mesh=spec.mesh)
        if refill.runs_refilled(spec.plan, spec.refill_slots):
            tree, pool_v, stats = refill.expand(model, env, pool, key, live_slots=spec.refill_slots, **kwargs)
        else:
            tree, pool_v, stats = expand(model, env, pool, key, **kwargs)
        return update_from_tree(graphdef, tx, spec, state, tree, pool, pool_v, stats)

    return jax.jit(step, donate_argnums=0)


@functools.lru_cache(maxsize=8)
def build_update(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, spec: StepSpec):
    """The update alone, jitted, for trees rolled out with a host environment (`rollout.host.expand_host`):
    (state, tree, pool, pool_v, stats) -> (state, metrics). Compiles once per shapes; built once per process for
    equal arguments (like `steps.make_step`: a resumed run in the same process traces nothing again)."""
    return jax.jit(functools.partial(update_from_tree, graphdef, tx, spec), donate_argnums=0)
