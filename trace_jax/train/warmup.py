"""Predictor warm-up: fit the success head on rollouts of the frozen base policy before RL steers with it.

The base policy expands uniform trees (every prompt gets the same roots, every anchor the same share of
continuations) with the same engine and sampling as training, so the head sees prompt-level and
turn-level targets (`objectives.node_targets`). With the backbone frozen the head is a linear read of
fixed features, so the fit is full-batch Adam on the log loss (see `fit_head`).
A quarter of the prompts is held out and the head's quality on them is reported.
"""

from __future__ import annotations

import dataclasses
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
from trace_jax.objectives import auc, calibration, node_targets
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool, expand_tree
from trace_jax.rollout.tree import Tree
from trace_jax.train.step import HEAD_PARAMS


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Readings:
    """Predictor training data from trees: one row per distinct node with a reading."""

    features: jax.Array  # [K, D] float32 final hidden state at the node's last token
    target: jax.Array  # [K] float32 success rate of the leaves below the node
    outcome: jax.Array  # [K] float32 reward of the slot the node was read on (its leaf outcome)
    is_root: jax.Array  # [K] bool: a prompt node (else a turn node)
    prompt: jax.Array  # [K] int32 global id of the node's prompt (holds out whole prompts)


@nnx.jit
def read_hidden(model: Policy, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    """[S, T+1, D] float32 final hidden state at each node's read position, from one forward of tokens [S, L]."""
    hidden = model(tokens).hidden
    return jnp.take_along_axis(hidden, positions[..., None], axis=1).astype(jnp.float32)


_node_targets = jax.jit(node_targets)  # one program (eagerly, each small op compiles)


def tree_readings(model: Policy, tree: Tree, prompt_offset: int) -> Readings:
    """The distinct, read nodes of `tree` as predictor data (numpy, gathered from every process); prompts
    numbered from prompt_offset."""
    hidden = shd.to_host(read_hidden(model, tree.tokens, tree.read_positions()))
    tree = shd.to_host(tree)
    targets, weight = map(np.asarray, _node_targets(tree))
    rows, cols = np.nonzero(weight > 0)
    return Readings(features=hidden[rows, cols], target=targets[rows, cols],
                    outcome=np.asarray(tree.reward)[rows].astype(np.float32), is_root=cols == 0,
                    prompt=(prompt_offset + np.asarray(tree.prompt)[rows]).astype(np.int32))


def concat(parts: list[Readings]) -> Readings:
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def select(r: Readings, mask: np.ndarray) -> Readings:
    return jax.tree.map(lambda x: x[mask], r)


def fit_head(kernel: jax.Array, bias: jax.Array, data: Readings, steps: int, learning_rate: float,
             l2: float = 1e-4) -> tuple[jax.Array, jax.Array]:
    """(kernel [D], bias []) after `steps` full-batch Adam steps on the log loss of sigmoid(f.k + b) against the
    soft targets, plus l2 * |k|^2.

    The log loss has the same minimiser as the squared error RL uses (the targets' conditional mean), but it is
    convex for a linear head and its gradient does not vanish on a saturated sigmoid: a squared-error fit can
    push every logit to one side (V~ = 1 everywhere on a pool of mostly solved prompts) and never come back.
    """
    tx = optax.adam(learning_rate)
    x, y = jnp.asarray(data.features), jnp.asarray(data.target)

    def loss(p):
        logit = x @ p[0] + p[1]
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logit, y)) + l2 * jnp.sum(p[0] ** 2)

    def body(carry, _):
        p, s = carry
        g = jax.grad(loss)(p)
        u, s = tx.update(g, s, p)
        return (optax.apply_updates(p, u), s), None

    p = (jnp.asarray(kernel, jnp.float32), jnp.asarray(bias, jnp.float32))
    (p, _), _ = jax.jit(lambda p: jax.lax.scan(body, (p, tx.init(p)), None, length=steps))(p)
    return p


@jax.jit
def _quality(pred: jax.Array, target: jax.Array, won: jax.Array, mask: jax.Array) -> tuple[jax.Array, ...]:
    """(AUC, Brier, ECE) of pred [K] over mask [K]: one program (eagerly, each small op would compile on its own)."""
    brier, ece = calibration(pred, target, mask.astype(jnp.float32))
    return auc(pred, won, mask), brier, ece


def quality(pred: np.ndarray, data: Readings) -> dict[str, float]:
    """AUC of V~ for the leaf outcome, and Brier/ECE against node targets, for root and prefix nodes."""
    out = {}
    for name, mask in (("root", data.is_root), ("prefix", ~data.is_root)):
        area, brier, ece = _quality(pred, data.target, data.outcome > 0.5, mask)
        out |= {f"{name}_auc": float(area), f"{name}_brier": float(brier), f"{name}_ece": float(ece),
                f"{name}_nodes": int(mask.sum())}
    return out


@dataclasses.dataclass(frozen=True)
class WarmupSpec:
    """How the head is warmed up: `batches` uniform-tree expansions of the pool, then the fit."""

    batches: int
    group_size: int
    roots: int
    continuations: int
    fit_steps: int
    learning_rate: float
    sampling: SamplingConfig
    pad_id: int


def warm_up_predictor(model: Policy, env: JaxEnv | HostEnv, pools: Callable[[int], Pool], key: jax.Array,
                      spec: WarmupSpec, expand: Callable = expand_tree) -> tuple[Policy, dict[str, float]]:
    """(model with a fitted success head, report). `pools(i)` is the i-th pool of prompts to roll out, by
    `expand`: `expand_tree` for a JAX env, `rollout.host.expand_host` for a host env.

    The report holds the held-out quality before ("warmup/before/...") and after ("warmup/...") the fit, plus
    the std of V~ over held-out prompt nodes.
    """
    plan = Plan(Allocator("uniform_tree", group_size=spec.group_size), roots=spec.roots,
                continuations=spec.continuations)
    parts = []
    for i in tqdm(range(spec.batches), desc="predictor warm-up", leave=False):
        tree, _, _ = expand(model, env, pools(i), jax.random.fold_in(key, i), plan=plan, sampling=spec.sampling,
                            pad_id=spec.pad_id)
        parts.append(tree_readings(model, tree, prompt_offset=i * pools(i).lengths.shape[0]))
    data = concat(parts)
    held = np.random.default_rng(0).random(int(data.prompt.max()) + 1) < 0.25
    held_out, train = select(data, held[data.prompt]), select(data, ~held[data.prompt])

    def predict(k, b, r: Readings) -> np.ndarray:
        return np.asarray(jax.nn.sigmoid(jnp.asarray(r.features) @ k + b))

    placed = [getattr(model, name)[...] for name in HEAD_PARAMS]  # (kernel, bias) as the model holds them
    start = shd.to_host(placed)  # the fit runs on every process's own device, on the same gathered data
    before = quality(predict(*start, held_out), held_out)
    kernel, bias = fit_head(*start, train, spec.fit_steps, spec.learning_rate)
    for name, old, new in zip(HEAD_PARAMS, placed, (kernel, bias)):
        getattr(model, name)[...] = shd.put_global(np.asarray(new, old.dtype), old.sharding)
    pred = predict(kernel, bias, held_out)
    report = {f"warmup/{k}": v for k, v in quality(pred, held_out).items()}
    report |= {f"warmup/before/{k}": v for k, v in before.items() if not k.endswith("_nodes")}
    report["warmup/root_v_std"] = float(pred[held_out.is_root].std())
    report["warmup/train_nodes"] = int(train.target.size)
    return model, report
