"""Training signals from a rollout tree: predictor targets, tree-aware advantages, losses, diagnostics.

Nodes: (s, 0) is slot s's prompt, (s, t+1) its history after turn t's observation. A root's node
(r, t+1) covers root r and its continuations with branch_turn >= t; a continuation's nodes up to its
branch (index <= branch_turn + 1) are copies of its parent's, later ones cover only itself.
Unused slots (`not tree.used`) contribute nothing anywhere. Letters: see `rollout/tree.py`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from trace_jax.rollout.tree import Tree
from trace_jax.validate import concrete


def _prompt_ids(tree: Tree) -> tuple[jax.Array, jax.Array]:
    """(ids [S] in [0, S] with S for unused slots, used [S]): dense per-prompt segment ids."""
    used = tree.used
    ids = jnp.searchsorted(jnp.sort(tree.prompt), tree.prompt, side="left")
    return jnp.where(used, ids, tree.num_slots), used


def _segment_stats(values: jax.Array, ids: jax.Array, num: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-segment (count, mean, unbiased variance) of values [S] over ids [S] in [0, num)."""
    count = jax.ops.segment_sum(jnp.ones_like(values), ids, num)
    mean = jax.ops.segment_sum(values, ids, num) / jnp.maximum(count, 1.0)
    ss = jax.ops.segment_sum((values - mean[ids]) ** 2, ids, num)
    return count, mean, jnp.where(count > 1, ss / jnp.maximum(count - 1.0, 1.0), 0.0)


def _node_stats(tree: Tree) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(count, mean, unbiased variance) [S, T] of the leaf rewards under each root node (r, t+1)."""
    s, turns = tree.boundaries.shape
    used = tree.used
    reward = jnp.where(used, tree.reward, 0.0)
    cont = tree.is_continuation
    row = jnp.where(cont, tree.parent, s)  # out of range: dropped
    col = jnp.maximum(tree.branch_turn, 0)

    def below(x: jax.Array) -> jax.Array:  # [S] per continuation -> [S, T] summed over branch_turn >= t
        at = jnp.zeros((s, turns), x.dtype).at[row, col].add(x, mode="drop")
        return jnp.cumsum(at[:, ::-1], axis=1)[:, ::-1]

    count = 1.0 + below(jnp.ones_like(reward))
    mean = (reward[:, None] + below(reward)) / count
    covers = cont[:, None] & (jnp.arange(turns) <= tree.branch_turn[:, None])  # [S, T] under (parent, t+1)
    dev = jnp.where(covers, (reward[:, None] - mean[jnp.minimum(row, s - 1)]) ** 2, 0.0)
    ss = (reward[:, None] - mean) ** 2 + jnp.zeros((s, turns)).at[row].add(dev, mode="drop")
    return count, mean, jnp.where(count > 1, ss / jnp.maximum(count - 1.0, 1.0), 0.0)


def node_targets(tree: Tree) -> tuple[jax.Array, jax.Array]:
    """(targets [S, T+1], weight [S, T+1]): success rate of the leaves below each node, bottom-up.

    A leaf's target is its reward; an inner node's the mean reward of all leaves below it. Weight 1
    marks each distinct node once where it has a reading (`tree.has_reading`): the prompt node on the
    prompt's first slot, shared prefix nodes on the root; copies get their node's target, weight 0.
    """
    s, turns = tree.boundaries.shape
    ids, used = _prompt_ids(tree)
    reward = jnp.where(used, tree.reward, 0.0)
    _, prompt_mean, _ = _segment_stats(reward, ids, s + 1)
    _, node_mean, _ = _node_stats(tree)
    cont = tree.is_continuation
    shared = cont[:, None] & (jnp.arange(turns) <= tree.branch_turn[:, None])  # [S, T] copied nodes
    parent = jnp.where(cont, tree.parent, jnp.arange(s))
    after = jnp.where(shared, node_mean[parent], jnp.where(cont[:, None], reward[:, None], node_mean))
    targets = jnp.where(used[:, None], jnp.concatenate([prompt_mean[ids][:, None], after], axis=1), 0.0)
    first = jax.ops.segment_min(jnp.arange(s), ids, s + 1)[ids] == jnp.arange(s)
    own = jnp.concatenate([first[:, None], ~shared], axis=1)
    weight = own & used[:, None] & tree.has_reading
    return targets, weight.astype(jnp.float32)


def _normalized(r: jax.Array, mean: jax.Array, var: jax.Array, eps: float) -> jax.Array:
    """(r - mean) / (std + eps), 0 where the group has (numerically) no spread."""
    std = jnp.sqrt(var)
    return jnp.where(std > eps, (r - mean) / (std + eps), 0.0)


def advantages(tree: Tree, eps: float = 1e-6) -> jax.Array:
    """A [S] = (r - mean_prompt) / std_prompt + (r - mean_anchor) / std_anchor per leaf (0 if unused).

    prompt group: every leaf of the prompt's tree; anchor group: the leaves under the leaf's deepest
    branch point, node (p, b+1) for a continuation (parent p, branch_turn b), node (r, b*+1) for a root
    r whose continuations branch at most at b* (no continuations: no anchor term). Stds are unbiased;
    a tree without branches gives exactly GRPO's (r - mean) / (std + eps).
    """
    s = tree.num_slots
    ids, used = _prompt_ids(tree)
    reward = jnp.where(used, tree.reward, 0.0)
    _, p_mean, p_var = _segment_stats(reward, ids, s + 1)
    a_count, a_mean, a_var = _node_stats(tree)
    cont = tree.is_continuation
    deepest = jnp.full((s,), Tree.NO_TURN, jnp.int32).at[jnp.where(cont, tree.parent, s)].max(
        tree.branch_turn, mode="drop")
    node_row = jnp.where(cont, tree.parent, jnp.arange(s))
    node_col = jnp.where(cont, tree.branch_turn, deepest)
    has_anchor = used & (node_col != Tree.NO_TURN)
    r_, c_ = node_row, jnp.maximum(node_col, 0)
    anchor = jnp.where(has_anchor, _normalized(reward, a_mean[r_, c_], a_var[r_, c_], eps), 0.0)
    prompt = _normalized(reward, p_mean[ids], p_var[ids], eps)
    return jnp.where(used, prompt + anchor, 0.0)


def _term_mean(total: jax.Array, terms: jax.Array) -> jax.Array:
    """Mean over terms of a per-token sum: sum(total) / sum(terms) over the tokens with terms > 0."""
    return jnp.sum(jnp.where(terms > 0, total, 0.0)) / jnp.maximum(terms.sum(), 1)


def _weighted_mean(x: jax.Array, weight: jax.Array) -> jax.Array:
    """Mean of x over weight's terms (weight: a mask, or how many terms each entry stands for)."""
    return _term_mean(weight * x, weight)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenWeights:
    """The loss terms each scored token carries, so that token means over them are means over (slot, position).

    Unpacked, each policy token is one term (`of_mask`). Packed (`train/packing.py`), a token fed once carries
    the terms of every slot that holds a copy of it as a policy token; the means are then the unpacked ones.
    Shapes [...] are the scored tokens'.
    """

    paths: jax.Array  # [...] float32 n: slots whose policy token this is (0: not scored)
    pos_adv: jax.Array  # [...] float32 sum of their advantages' positive parts, A+ = max(A, 0)
    neg_adv: jax.Array  # [...] float32 sum of their advantages' negative parts, A- = max(-A, 0)
    num_pos: jax.Array  # [...] float32 of them with A > 0
    num_neg: jax.Array  # [...] float32 of them with A < 0

    @classmethod
    def of_mask(cls, mask: jax.Array, adv: jax.Array) -> TokenWeights:
        """One term per policy token: mask [S, L] bool, adv [S]."""
        m, a = mask.astype(jnp.float32), adv[:, None]
        return cls(paths=m, pos_adv=m * jnp.maximum(a, 0.0), neg_adv=m * jnp.maximum(-a, 0.0),
                   num_pos=m * (a > 0), num_neg=m * (a < 0))


def policy_loss(logp_new: jax.Array, logp_old: jax.Array, mask: jax.Array, adv: jax.Array, clip_eps: float,
                ref_logp: jax.Array | None = None, kl_coef: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-level clipped surrogate over all policy tokens of the batch, plus kl_coef * k3 KL to ref.

    logp_new, logp_old, ref_logp, mask: [S, L] (mask: policy tokens of used slots); adv [S]. The metrics are
    `weighted_policy_loss`'s with one term per policy token.
    """
    return weighted_policy_loss(logp_new, logp_old, TokenWeights.of_mask(mask, adv), clip_eps, ref_logp, kl_coef)


def weighted_policy_loss(logp_new: jax.Array, logp_old: jax.Array, weights: TokenWeights, clip_eps: float,
                         ref_logp: jax.Array | None = None, kl_coef: float = 0.0
                         ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`policy_loss` over scored tokens that each carry `weights`' terms: logp_new, logp_old, ref_logp [...].

    A term's clipped surrogate -min(r A, clip(r, 1 - eps, 1 + eps) A) is -A+ min(r, 1 + eps) + A- max(r, 1 - eps),
    so a token's terms add up through its sums of A+ and A-; the means divide by the number of terms.
    Metrics: pg_loss, clip_frac (terms where the clipped term is active), approx_kl (k3 of old vs new),
    ratio_mean, ratio_max_dev (max |ratio - 1|: 0 on the first, on-policy update), and kl_ref when
    ref_logp is given.
    """
    kl = concrete(kl_coef)
    if ref_logp is None and (kl is None or kl != 0):
        raise ValueError("a KL coefficient needs ref_logp")
    n = weights.paths
    log_ratio = logp_new - logp_old
    ratio = jnp.exp(log_ratio)
    lo, hi = 1.0 - clip_eps, 1.0 + clip_eps
    pg = _term_mean(-weights.pos_adv * jnp.minimum(ratio, hi) + weights.neg_adv * jnp.maximum(ratio, lo), n)
    metrics = {
        "pg_loss": pg,
        "clip_frac": _term_mean(weights.num_pos * (ratio > hi) + weights.num_neg * (ratio < lo), n),
        "approx_kl": _weighted_mean(ratio - 1.0 - log_ratio, n),
        "ratio_mean": _weighted_mean(ratio, n),
        "ratio_max_dev": jnp.max(jnp.where(n > 0, jnp.abs(ratio - 1.0), 0.0)),
    }
    loss = pg
    if ref_logp is not None:
        d = ref_logp - logp_new
        metrics["kl_ref"] = _weighted_mean(jnp.exp(d) - d - 1.0, n)
        loss = loss + kl_coef * metrics["kl_ref"]
    return loss, metrics


def entropy(logp: jax.Array, weight: jax.Array) -> jax.Array:
    """Token-mean entropy of the distributions logp [..., V] (log-probabilities) over weight [...]: a mask, or
    the terms each distribution stands for (`TokenWeights.paths`)."""
    return _weighted_mean(-jnp.sum(jnp.exp(logp) * logp, axis=-1), weight)


def predictor_loss(pred: jax.Array, targets: jax.Array, weight: jax.Array) -> jax.Array:
    """Weighted mean squared error of predictions pred [S, T+1] against node targets."""
    return jnp.sum(weight * (pred - targets) ** 2) / jnp.maximum(weight.sum(), 1.0)


def reliability_bins(pred: jax.Array, targets: jax.Array, weight: jax.Array, bins: int = 10
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(weight [bins], mean prediction [bins], mean target [bins]) over equal-width bins of pred in [0, 1]:
    the points of a reliability diagram (means are 0 in empty bins)."""
    b = jnp.clip(jnp.floor(pred * bins), 0, bins - 1).astype(jnp.int32).reshape(-1)
    w = weight.reshape(-1)
    count = jax.ops.segment_sum(w, b, bins)
    mean = lambda x: jax.ops.segment_sum(w * x.reshape(-1), b, bins) / jnp.maximum(count, 1e-12)
    return count, mean(pred), mean(targets)


def calibration(pred: jax.Array, targets: jax.Array, weight: jax.Array, bins: int = 10
                ) -> tuple[jax.Array, jax.Array]:
    """(Brier score, expected calibration error over `bins` equal-width bins of pred), weighted; both NaN when no
    node has weight (e.g. prefix reads of episodes that all ended at their first turn), not a perfect 0."""
    weight_sum = weight.sum()
    total = jnp.where(weight_sum > 0, weight_sum, jnp.nan)
    brier = jnp.sum(weight * (pred - targets) ** 2) / total
    count, mean_pred, mean_target = reliability_bins(pred, targets, weight, bins)
    return brier, jnp.sum(count * jnp.abs(mean_pred - mean_target)) / total


def ece_floor(pred: jax.Array, weight: jax.Array, key: jax.Array, draws: int = 256, bins: int = 10) -> jax.Array:
    """Expected ECE of a perfectly calibrated predictor making these predictions (pred, weight [...]), each node's
    binary outcome drawn from Bernoulli(pred), averaged over `draws`: what ECE measures from sampling noise alone on
    this many nodes. Outcomes are drawn independently per node, so where nodes share one outcome (the turns of an
    episode) the true floor is higher."""
    pred = jnp.clip(pred, 0.0, 1.0)
    outcomes = jax.random.bernoulli(key, pred, (draws, *pred.shape)).astype(jnp.float32)
    return jnp.mean(jax.vmap(lambda y: calibration(pred, y, weight, bins)[1])(outcomes))


def calibration_report(pred: jax.Array, targets: jax.Array, weight: jax.Array, bins: int = 10
                       ) -> dict[str, jax.Array]:
    """Brier and ECE separately for root nodes (index 0) and prefix nodes (index >= 1)."""
    root = calibration(pred[:, :1], targets[:, :1], weight[:, :1], bins)
    prefix = calibration(pred[:, 1:], targets[:, 1:], weight[:, 1:], bins)
    return {"root_brier": root[0], "root_ece": root[1], "prefix_brier": prefix[0], "prefix_ece": prefix[1]}


def solve_rates(tree: Tree) -> dict[str, jax.Array]:
    """Shares of the opened prompts whose leaves all succeed, all fail, or are mixed (solve_partial: the
    effective ratio, the share whose tree has contrast, max reward > min reward)."""
    s = tree.num_slots
    ids, used = _prompt_ids(tree)
    hi = jax.ops.segment_max(jnp.where(used, tree.reward, -jnp.inf), ids, s + 1)[:s]
    lo = jax.ops.segment_min(jnp.where(used, tree.reward, jnp.inf), ids, s + 1)[:s]
    has = jax.ops.segment_sum(used.astype(jnp.float32), ids, s + 1)[:s] > 0
    opened = jnp.maximum(jnp.sum(has), 1)
    return {"solve_all": jnp.sum(has & (lo > 0.5)) / opened, "solve_none": jnp.sum(has & (hi <= 0.5)) / opened,
            "solve_partial": jnp.sum(has & (hi > lo)) / opened}


def auc(score: jax.Array, label: jax.Array, mask: jax.Array) -> jax.Array:
    """Area under the ROC curve of `score` for binary `label` over `mask` (any equal shapes): the chance a
    positive outscores a negative, ties counting half (Mann-Whitney U). NaN where it is undefined: a class is empty
    or a score under the mask is NaN (a diverged predictor); logs write it as null and summaries skip it, where a
    0.5 would read as chance."""
    mask = mask.reshape(-1)
    undefined = jnp.any(mask & jnp.isnan(score.reshape(-1)))
    x = jnp.where(mask, score.reshape(-1).astype(jnp.float32), jnp.inf)  # masked entries rank last
    ordered = jnp.sort(x)
    rank = (jnp.searchsorted(ordered, x, side="left") + jnp.searchsorted(ordered, x, side="right") + 1) / 2.0
    pos = mask & label.reshape(-1).astype(bool)
    n_pos, n_neg = pos.sum().astype(jnp.float32), (mask & ~pos).sum().astype(jnp.float32)  # products pass 2^31
    u = jnp.sum(jnp.where(pos, rank, 0.0)) - n_pos * (n_pos + 1) / 2.0
    return jnp.where((n_pos > 0) & (n_neg > 0) & ~undefined, u / jnp.maximum(n_pos * n_neg, 1), jnp.nan)


def weighted_auc(score: np.ndarray, label: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """[B] AUC of score [K] for binary label [K] with each node counted weight[b, k] times (`auc`'s Mann-Whitney U
    over the repeated nodes, ties counting half), for B weightings at once (numpy; NaN where a class weighs 0)."""
    order = np.argsort(score, kind="stable")
    _, tie = np.unique(score[order], return_inverse=True)  # [K] tie group of each node, in score order
    w, y = weight[:, order].astype(np.float64), label[order].astype(bool)
    by_tie = lambda x: np.stack([np.bincount(tie, row, tie.max() + 1) for row in x])  # [B, groups]
    pos, neg = by_tie(np.where(y, w, 0.0)), by_tie(np.where(y, 0.0, w))
    below = np.cumsum(neg, axis=1) - neg  # negatives scoring lower than each tie group
    pairs = pos.sum(1) * neg.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, (pos * (below + neg / 2)).sum(1) / pairs, np.nan)


def auc_interval(score: np.ndarray, label: np.ndarray, cluster: np.ndarray, draws: int = 1000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """The `level` percentile interval of the AUC over `draws` bootstrap resamples of whole clusters [K] (nodes of
    one question move together: they are not independent); NaN without both classes."""
    if len(score) == 0:
        return float("nan"), float("nan")
    _, which = np.unique(cluster, return_inverse=True)  # [K] dense cluster id
    picks = np.random.default_rng(seed).integers(0, which.max() + 1, (draws, which.max() + 1))  # [B, C]
    counts = np.stack([np.bincount(p, minlength=which.max() + 1) for p in picks])  # [B, C] times each is drawn
    areas = weighted_auc(score, label, counts[:, which])
    areas = areas[np.isfinite(areas)]
    if not len(areas):
        return float("nan"), float("nan")
    lo, hi = np.percentile(areas, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def predictor_report(tree: Tree) -> dict[str, jax.Array]:
    """How well V~ separates outcomes: AUC of each reading against the leaf outcome of its slot, for the
    roots' prompt reads (node 0 of root slots) and for prefix reads (turn nodes of every used slot)."""
    win = tree.reward > 0.5
    root_mask = (tree.is_root & tree.has_reading[:, 0])[:, None]
    prefix_mask = tree.used[:, None] & tree.has_reading[:, 1:]
    return {"root_auc": auc(tree.success[:, :1], win[:, None], root_mask),
            "prefix_auc": auc(tree.success[:, 1:], jnp.broadcast_to(win[:, None], prefix_mask.shape), prefix_mask)}
