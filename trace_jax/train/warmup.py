"""Predictor warm-up: fit the success head on rollouts of the frozen base policy before RL steers with it.

The base policy expands uniform trees (every prompt gets the same roots, every anchor the same share of
continuations) with the same engine and sampling as training, so the head sees prompt-level and
turn-level targets (`objectives.node_targets`). With the backbone frozen the head is a linear read of
fixed features, so the fit is full-batch Adam on the log loss (see `fit_head`). A predictor with layers of its own
(`ModelConfig.predictor_layers`) reads whole sequences: its layers and head are fitted together by minibatches of
episodes over what the frozen layers below feed them, computed once (`fit_own_layers`).
A share of the questions (`held_out`, a quarter by default) is held out whole, and the predictor's quality on
them is reported with an interval over questions.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.envs.base import HostEnv, JaxEnv
from trace_jax.models.qwen3 import Policy
from trace_jax.objectives import auc, auc_interval, calibration, node_targets
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool, expand_tree
from trace_jax.rollout.tree import Tree
from trace_jax.train.step import HEAD_PARAMS, PREDICTOR_PARAMS


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Readings:
    """Predictor training data from trees: one row per distinct node with a reading."""

    features: jax.Array  # [K, D] float32 final hidden state at the node's last token
    target: jax.Array  # [K] float32 success rate of the leaves below the node
    outcome: jax.Array  # [K] float32 reward of the slot the node was read on (its leaf outcome)
    is_root: jax.Array  # [K] bool: a prompt node (else a turn node)
    question: jax.Array  # [K] int32 the node's question (held out whole: a question may be drawn again)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Episodes:
    """Predictor training data as whole slots, for a predictor with layers of its own (it reads the sequence)."""

    tokens: jax.Array  # [S, L] int32
    reads: jax.Array  # [S, T+1] int32 each node's read position (`Tree.read_positions`)
    target: jax.Array  # [S, T+1] float32 success rate of the leaves below each node (`objectives.node_targets`)
    weight: jax.Array  # [S, T+1] float32 1 on each distinct read node, once
    outcome: jax.Array  # [S] float32 the slot's reward
    question: jax.Array  # [S] int32 the slot's question
    slot: jax.Array  # [S] int32 the slot's row in the tree it came from


@nnx.jit
def read_hidden(model: Policy, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    """[S, T+1, D] float32 hidden state the success head reads at each node's read position, from one forward of
    tokens [S, L]."""
    hidden = model(tokens).predictor_hidden
    return jnp.take_along_axis(hidden, positions[..., None], axis=1).astype(jnp.float32)


_node_targets = jax.jit(node_targets)  # one program (eagerly, each small op compiles)


def tree_readings(model: Policy, tree: Tree) -> Readings:
    """The distinct, read nodes of `tree` as predictor data (numpy, gathered from every process)."""
    hidden = shd.to_host(read_hidden(model, tree.tokens, tree.read_positions()))  # [S, T+1, D]
    nodes, rows, cols = episode_nodes(e := tree_episodes(tree))
    return dataclasses.replace(nodes, features=hidden[e.slot[rows], cols])


def tree_episodes(tree: Tree) -> Episodes:
    """The slots of `tree` that hold a distinct read node as predictor data (numpy, gathered from every process)."""
    tree = shd.to_host(tree)
    targets, weight = map(np.asarray, _node_targets(tree))
    own = weight.sum(1) > 0
    return Episodes(tokens=np.asarray(tree.tokens)[own], reads=np.asarray(tree.read_positions())[own],
                    target=targets[own], weight=weight[own], outcome=np.asarray(tree.reward, np.float32)[own],
                    question=np.asarray(tree.question)[own].astype(np.int32),
                    slot=np.flatnonzero(own).astype(np.int32))


def episode_nodes(e: Episodes) -> tuple[Readings, np.ndarray, np.ndarray]:
    """(the distinct read nodes of `e` as `Readings` without features, their episodes [K], their columns [K])."""
    rows, cols = np.nonzero(e.weight > 0)
    return Readings(features=None, target=e.target[rows, cols], outcome=e.outcome[rows], is_root=cols == 0,
                    question=e.question[rows]), rows, cols


def concat(parts: list):
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def select(r, mask: np.ndarray):
    return jax.tree.map(lambda x: x[mask], r)


OWN_LAYERS = nnx.All(nnx.Param, nnx.Any(*(nnx.PathContains(name) for name in PREDICTOR_PARAMS)))  # what is fitted


@nnx.jit
def _read_success(model: Policy, tokens: jax.Array, reads: jax.Array) -> jax.Array:
    """[S, T+1] float32 V~ at each node's read position reads [S, T+1] of tokens [S, L]."""
    return jnp.take_along_axis(model(tokens).success, reads, axis=1)


@nnx.jit
def _predictor_input(model: Policy, tokens: jax.Array) -> jax.Array:
    return model.predictor_input(tokens)


def _batched(fn: Callable, model: Policy, arrays: tuple[np.ndarray, ...], batch: int) -> np.ndarray:
    """fn(model, *rows of `arrays`) over all their rows, `batch` rows a call (the last batch padded), as numpy
    gathered from every process."""
    s = len(arrays[0])
    pad = -s % batch
    arrays = [np.concatenate([x, np.repeat(x[:1], pad, axis=0)]) for x in arrays]
    place = model.success_bias[...].sharding  # replicated where the model is
    return np.concatenate([shd.to_host(fn(model, *shd.put_global(tuple(x[i:i + batch] for x in arrays),
                                                                 (place,) * len(arrays))))
                           for i in range(0, s + pad, batch)])[:s]


def episode_values(model: Policy, e: Episodes, batch: int) -> np.ndarray:
    """[S, T+1] V~ at every read position of `e`, `batch` slots per forward."""
    if len(e.tokens) == 0:  # e.g. no question held out of a small warm-up
        return np.zeros(e.reads.shape, np.float32)
    return _batched(_read_success, model, (e.tokens, e.reads), batch)


@nnx.jit
def _fit_step(model: Policy, opt: nnx.Optimizer, x: jax.Array, reads: jax.Array, target: jax.Array,
              weight: jax.Array) -> jax.Array:
    def loss(m: Policy) -> jax.Array:
        logit = m.success_logit(jnp.take_along_axis(m.predictor_hidden_from(x), reads[..., None], axis=1))
        return jnp.sum(weight * optax.sigmoid_binary_cross_entropy(logit, target)) / jnp.maximum(weight.sum(), 1.0)

    value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, OWN_LAYERS))(model)
    opt.update(model, grads)
    return value


FIT_WIDTH = 64  # a minibatch's positions are cut after its last read, rounded up to a multiple of this


def fit_own_layers(model: Policy, data: Episodes, steps: int, learning_rate: float, rows: int, seed: int = 0,
                   batch: int = 64) -> None:
    """Fit the predictor's own layers and head of `model` in place (nothing else moves): `steps` AdamW minibatches
    (weight decay 0.01) of `rows` slots drawn without replacement, on the log loss of V~ at each distinct node
    against its soft target. The layers below are frozen, so what they feed the predictor is computed once,
    `batch` slots per forward, and each minibatch runs the predictor's layers alone, over its positions up to its
    last read (`FIT_WIDTH`; attention is causal, so the positions after it change nothing). Every process draws the
    same minibatches."""
    width = int(data.reads.max()) + 1
    x = _batched(_predictor_input, model, (data.tokens[:, :width],), batch)  # [S, width, hidden]
    opt = nnx.Optimizer(model, optax.adamw(learning_rate, weight_decay=1e-2), wrt=OWN_LAYERS)
    rng, place = np.random.default_rng(seed), model.success_bias[...].sharding
    for _ in tqdm(range(steps), desc="predictor fit", leave=False):
        i = np.sort(rng.choice(len(x), min(rows, len(x)), replace=False))
        cut = min(width, -(-(int(data.reads[i].max()) + 1) // FIT_WIDTH) * FIT_WIDTH)
        _fit_step(model, opt, *shd.put_global((x[i, :cut], data.reads[i], data.target[i], data.weight[i]),
                                              (place,) * 4))


def fit_head(kernel: jax.Array, bias: jax.Array, data: Readings, steps: int, learning_rate: float,
             l2: float = 1e-4) -> tuple[jax.Array, jax.Array]:
    """(kernel [D], bias []) after `steps` full-batch Adam steps on the log loss of sigmoid(f.k + b) against the
    soft targets, plus l2 * |k|^2.

    The log loss has the same minimiser as the squared error RL uses (the targets' conditional mean), but it is
    convex for a linear head and its gradient does not vanish on a saturated sigmoid: a squared-error fit can
    push every logit to one side (V~ = 1 everywhere on a pool of mostly solved prompts) and never come back.
    """
    p = (jnp.asarray(kernel, jnp.float32), jnp.asarray(bias, jnp.float32))
    return _fit_head(p, jnp.asarray(data.features), jnp.asarray(data.target), steps, learning_rate, l2)


@functools.partial(jax.jit, static_argnames=("steps", "learning_rate", "l2"))  # one program per setting
def _fit_head(p: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array, steps: int, learning_rate: float,
              l2: float) -> tuple[jax.Array, jax.Array]:
    tx = optax.adam(learning_rate)

    def loss(p):
        logit = x @ p[0] + p[1]
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logit, y)) + l2 * jnp.sum(p[0] ** 2)

    def body(carry, _):
        p, s = carry
        u, s = tx.update(jax.grad(loss)(p), s, p)
        return (optax.apply_updates(p, u), s), None

    return jax.lax.scan(body, (p, tx.init(p)), None, length=steps)[0][0]


@jax.jit
def _quality(pred: jax.Array, target: jax.Array, won: jax.Array, mask: jax.Array) -> tuple[jax.Array, ...]:
    """(AUC, Brier, ECE) of pred [K] over mask [K]: one program (eagerly, each small op would compile on its own)."""
    brier, ece = calibration(pred, target, mask.astype(jnp.float32))
    return auc(pred, won, mask), brier, ece


def quality(pred: np.ndarray, data: Readings) -> dict[str, float]:
    """AUC of V~ for the leaf outcome (with its 95% interval over questions resampled whole, `auc_interval`), and
    Brier/ECE against node targets, for root and prefix nodes, and how many nodes and questions each holds."""
    out = {}
    for name, mask in (("root", data.is_root), ("prefix", ~data.is_root)):
        area, brier, ece = _quality(pred, data.target, data.outcome > 0.5, mask)
        lo, hi = auc_interval(pred[mask], data.outcome[mask] > 0.5, data.question[mask])
        out |= {f"{name}_auc": float(area), f"{name}_auc_lo": lo, f"{name}_auc_hi": hi, f"{name}_brier": float(brier),
                f"{name}_ece": float(ece), f"{name}_nodes": int(mask.sum()),
                f"{name}_questions": len(np.unique(data.question[mask]))}
    return out


@dataclasses.dataclass(frozen=True)
class WarmupSpec:
    """How the predictor is warmed up: `batches` uniform-tree expansions of the pool, then the fit: `fit_steps`
    full-batch steps of the linear head at `learning_rate`, or, for a predictor with layers of its own,
    `fit_steps` minibatches of `fit_rows` episodes at `layers_learning_rate`. `held_out`: the share of the drawn
    questions held out whole, on which the fit is reported."""

    batches: int
    group_size: int
    roots: int
    continuations: int
    fit_steps: int
    learning_rate: float
    sampling: SamplingConfig
    pad_id: int
    fit_rows: int = 16
    layers_learning_rate: float = 1e-3
    held_out: float = 0.25


def warm_up_predictor(model: Policy, env: JaxEnv | HostEnv, pools: Callable[[int], Pool], key: jax.Array,
                      spec: WarmupSpec, expand: Callable = expand_tree) -> tuple[Policy, dict[str, float]]:
    """(model with a fitted success predictor, report). `pools(i)` is the i-th pool of prompts to roll out, by
    `expand` (its tree first of what it returns): `expand_tree` for a JAX env, `rollout.host.expand_host` for a
    host env, `rollout.schedule.expand_scheduled` in chunks or on refilled rows.

    The report holds the held-out quality before ("warmup/before/...") and after ("warmup/...") the fit, plus
    the std of V~ over held-out prompt nodes.
    """
    plan = Plan(Allocator("uniform_tree", group_size=spec.group_size), roots=spec.roots,
                continuations=spec.continuations)
    own = model.cfg.predictor_layers > 0
    parts = []
    for i in tqdm(range(spec.batches), desc="predictor warm-up", leave=False):
        tree = expand(model, env, pools(i), jax.random.fold_in(key, i), plan=plan, sampling=spec.sampling,
                      pad_id=spec.pad_id)[0]
        parts.append(tree_episodes(tree) if own else tree_readings(model, tree))
    data = concat(parts)
    held = np.random.default_rng(0).random(int(data.question.max()) + 1) < spec.held_out  # by question
    held_out, train = select(data, held[data.question]), select(data, ~held[data.question])
    if own:
        return model, _warm_up_own_layers(model, held_out, train, spec)

    def predict(k, b, r: Readings) -> np.ndarray:
        return np.asarray(jax.nn.sigmoid(jnp.asarray(r.features) @ k + b))

    placed = [getattr(model, name)[...] for name in HEAD_PARAMS]  # (kernel, bias) as the model holds them
    start = shd.to_host(placed)  # the fit runs on every process's own device, on the same gathered data
    before = quality(predict(*start, held_out), held_out)
    kernel, bias = fit_head(*start, train, spec.fit_steps, spec.learning_rate)
    for name, old, new in zip(HEAD_PARAMS, placed, (kernel, bias)):
        getattr(model, name)[...] = shd.put_global(np.asarray(new, old.dtype), old.sharding)
    pred = predict(kernel, bias, held_out)
    return model, _report(before, quality(pred, held_out), pred[held_out.is_root], int(train.target.size))


def _warm_up_own_layers(model: Policy, held_out: Episodes, train: Episodes, spec: WarmupSpec) -> dict[str, float]:
    """`warm_up_predictor`'s fit (on `train`) and report (on `held_out`) for a predictor with layers of its own."""
    nodes, rows, cols = episode_nodes(held_out)
    batch = max(spec.fit_rows, 64)
    before = quality(episode_values(model, held_out, batch)[rows, cols], nodes)
    fit_own_layers(model, train, spec.fit_steps, spec.layers_learning_rate, spec.fit_rows, batch=batch)
    pred = episode_values(model, held_out, batch)[rows, cols]
    return _report(before, quality(pred, nodes), pred[nodes.is_root], int(train.weight.sum()))


def _report(before: dict[str, float], after: dict[str, float], root_v: np.ndarray, train_nodes: int
            ) -> dict[str, float]:
    report = {f"warmup/{k}": v for k, v in after.items()}
    report |= {f"warmup/before/{k}": v for k, v in before.items() if k.endswith(("_auc", "_brier", "_ece"))}
    report["warmup/root_v_std"] = float(root_v.std()) if root_v.size else float("nan")  # nan: no question held out
    report["warmup/train_nodes"] = train_nodes
    return report
