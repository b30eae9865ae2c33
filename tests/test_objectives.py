"""Objectives: tree targets and advantages against hand-computed and brute-force references, losses."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import toy
from trace_jax.objectives import (
    advantages,
    auc,
    auc_interval,
    calibration,
    calibration_report,
    ece_floor,
    entropy,
    node_targets,
    policy_loss,
    predictor_loss,
    predictor_report,
    solve_rates,
    weighted_auc,
)
from trace_jax.rollout.sampling import policy_logprobs
from trace_jax.rollout.tree import Tree

TURNS = 3
node_targets_jit = jax.jit(node_targets)
advantages_jit = jax.jit(advantages)


def make_tree(prompt, parent, branch_turn, num_turns, reward, success=None) -> Tree:
    """The shared tree factory with this file's turn count."""
    return toy.make_tree(prompt, num_turns, reward, parent=parent, branch_turn=branch_turn, success=success,
                         turns=TURNS)


# Two prompts (pool ids 7 and 3), M = 4 roots, N = 1: slots 4-6 are continuations, slot 7 unused.
#   prompt 7: root 0 (3 turns, r=1) with forks 4 (after turn 0, r=0) and 5 (after turn 1, r=1); root 1 (r=0)
#   prompt 3: root 2 (2 turns, r=0) with fork 6 (after turn 0, r=1); root 3 (1 turn, r=0)
HAND = make_tree(prompt=[7, 7, 3, 3, 7, 7, 3, -1], parent=[-1, -1, -1, -1, 0, 0, 2, -1],
                 branch_turn=[-1, -1, -1, -1, 0, 1, 0, -1], num_turns=[3, 2, 2, 1, 3, 3, 3, 0],
                 reward=[1, 0, 0, 0, 0, 1, 1, 0])


def test_hand_tree_targets():
    targets, weight = (np.asarray(x) for x in node_targets_jit(HAND))
    h, t = 0.5, 1 / 3
    expected = {  # slot: targets at node indices 0..num_turns
        0: [h, 2 / 3, 1, 1], 1: [h, 0, 0], 2: [t, 0.5, 0], 3: [t, 0],
        4: [h, 2 / 3, 0, 0], 5: [h, 2 / 3, 1, 1], 6: [t, 0.5, 1, 1],
    }
    for slot, row in expected.items():
        assert np.allclose(targets[slot, :len(row)], row), slot
    assert weight.tolist() == [[1, 1, 1, 1], [0, 1, 1, 0], [1, 1, 1, 0], [0, 1, 0, 0],
                               [0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0]]
    assert (targets[7] == 0).all()


def test_hand_tree_advantages():
    a = np.asarray(advantages_jit(HAND, 1e-6))
    z7 = 0.5 / np.sqrt(1 / 3)  # prompt 7 rewards [1, 0, 0, 1]: mean 1/2, unbiased std sqrt(1/3)
    lo3, hi3 = -(1 / 3) / np.sqrt(1 / 3), (2 / 3) / np.sqrt(1 / 3)  # prompt 3 rewards [0, 0, 1]
    node01 = (0 - 2 / 3) / np.sqrt(1 / 3)  # slot 4 under node (0, 1): rewards [1, 0, 1]
    node21 = 0.5 / np.sqrt(0.5)  # slots 2, 6 under node (2, 1): rewards [0, 1]
    # slot 0's and 5's deepest branch point (0, 2) holds rewards [1, 1]: no spread, no anchor term
    expected = [z7, -z7, lo3 - node21, lo3, -z7 + node01, z7, hi3 + node21, 0.0]
    assert np.allclose(a, expected, atol=1e-5)


def test_effective_ratio():
    assert float(solve_rates(HAND)["solve_partial"]) == 1.0
    lost = make_tree(prompt=[7, 7, 3, 3, 7, 7, 3, -1], parent=[-1, -1, -1, -1, 0, 0, 2, -1],
                     branch_turn=[-1, -1, -1, -1, 0, 1, 0, -1], num_turns=[3, 2, 2, 1, 3, 3, 3, 0],
                     reward=[1, 0, 0, 0, 0, 1, 0, 1])  # prompt 3 all 0; the unused slot's 1 must not count
    assert float(jax.jit(solve_rates)(lost)["solve_partial"]) == 0.5


@st.composite
def trees(draw, roots=5, cont=2):
    """Random one-round trees: `roots` root slots, roots*cont continuation slots, rewards 0/1 or real."""
    binary = draw(st.booleans())
    rew = st.sampled_from([0.0, 1.0]) if binary else st.floats(0, 1, width=32)
    prompt = [draw(st.integers(-1, 2)) for _ in range(roots)]
    num_turns = [draw(st.integers(1, TURNS)) for _ in range(roots)]
    parent, branch, reward = [-1] * roots, [-1] * roots, [draw(rew) for _ in range(roots)]
    forkable = [r for r in range(roots) if prompt[r] >= 0 and num_turns[r] >= 2]
    for _ in range(roots * cont):
        if forkable and draw(st.booleans()):
            p = draw(st.sampled_from(forkable))
            b = draw(st.integers(0, num_turns[p] - 2))
            prompt.append(prompt[p]), parent.append(p), branch.append(b)
            num_turns.append(draw(st.integers(b + 2, TURNS))), reward.append(draw(rew))
        else:
            prompt.append(-1), parent.append(-1), branch.append(-1), num_turns.append(0), reward.append(0.0)
    return make_tree(prompt, parent, branch, num_turns, reward)


def paths(tree: Tree) -> list[tuple]:
    """Each used slot's history as (prompt, turn ids...): forks share their parent's ids up to the branch."""
    out = []
    for s in range(tree.num_slots):
        p, b = int(tree.parent[s]), int(tree.branch_turn[s])
        ids = [(p, t) if p >= 0 and t <= b else (s, t) for t in range(int(tree.num_turns[s]))]
        out.append((int(tree.prompt[s]), *ids) if tree.prompt[s] >= 0 else None)
    return out


def np_grpo(reward: np.ndarray, groups: list, eps: float) -> np.ndarray:
    """(r - mean) / (std + eps) with the unbiased std per group, 0 where a group has no spread."""
    out = np.zeros(len(reward))
    for members in groups:
        r = reward[members]
        std = r.std(ddof=1) if len(r) > 1 else 0.0
        if std > eps:
            out[members] += (r - r.mean()) / (std + eps)
    return out


@settings(max_examples=40, deadline=None)
@given(trees())
def test_targets_match_brute_force(tree):
    targets, weight = (np.asarray(x) for x in node_targets_jit(tree))
    hist, reward = paths(tree), np.asarray(tree.reward, np.float64)
    seen = set()
    for s, h in enumerate(hist):
        if h is None:
            assert (weight[s] == 0).all()
            continue
        for i in range(int(tree.num_turns[s]) + 1):
            node = h[: i + 1]
            below = [ell for ell, g in enumerate(hist) if g is not None and g[: i + 1] == node]
            assert np.isclose(targets[s, i], reward[below].mean(), atol=1e-6)
            assert weight[s, i] == (node not in seen)
            seen.add(node)
        assert (weight[s, int(tree.num_turns[s]) + 1:] == 0).all()


def np_tree_advantages(tree: Tree, eps: float) -> np.ndarray:
    """Prompt groups plus anchor groups: leaves under the deepest node with >= 2 children on each path."""
    hist, reward = paths(tree), np.asarray(tree.reward, np.float64)
    used = [s for s, h in enumerate(hist) if h is not None]
    prompts = {}
    for s in used:
        prompts.setdefault(hist[s][0], []).append(s)
    adv = np_grpo(reward, list(prompts.values()), eps)
    for s in used:
        h = hist[s]
        for depth in range(len(h) - 1, 1, -1):  # nodes of length >= 2: below the prompt node
            below = [ell for ell in used if hist[ell][:depth] == h[:depth]]
            children = {hist[ell][depth] for ell in below if len(hist[ell]) > depth}
            if len(children) >= 2:
                adv[s] += np_grpo(reward, [below], eps)[s]
                break
    return adv


@settings(max_examples=40, deadline=None)
@given(trees())
def test_advantages_match_brute_force(tree):
    assert np.allclose(advantages_jit(tree, 1e-6), np_tree_advantages(tree, 1e-6), rtol=1e-4, atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(trees(cont=0))
def test_advantages_without_branches_are_grpo(tree):
    prompt, reward = np.asarray(tree.prompt), np.asarray(tree.reward, np.float64)
    groups = [np.flatnonzero(prompt == p) for p in set(prompt.tolist()) - {-1}]
    # float32 against float64: dividing by a small group std (e.g. rewards 0.75, 0.75, 0.752) amplifies
    # rounding, so the tolerance is relative as well as absolute
    assert np.allclose(advantages_jit(tree, 1e-6), np_grpo(reward, groups, 1e-6), rtol=1e-4, atol=1e-5)


def test_policy_loss_matches_numpy():
    rng = np.random.default_rng(0)
    new, old, ref = (rng.normal(size=(3, 5)).astype(np.float32) * 0.3 for _ in range(3))
    mask = rng.random((3, 5)) < 0.7
    adv = rng.normal(size=3).astype(np.float32)
    loss, metrics = jax.jit(policy_loss, static_argnums=4)(new, old, mask, adv, 0.2, ref, 0.1)
    ratio = np.exp(new - old)
    surr = np.minimum(ratio * adv[:, None], np.clip(ratio, 0.8, 1.2) * adv[:, None])
    kl = np.exp(ref - new) - (ref - new) - 1
    assert np.isclose(metrics["pg_loss"], -surr[mask].mean(), atol=1e-6)
    assert np.isclose(loss, -surr[mask].mean() + 0.1 * kl[mask].mean(), atol=1e-6)
    clipped = np.clip(ratio, 0.8, 1.2) * adv[:, None] < ratio * adv[:, None]
    assert np.isclose(metrics["clip_frac"], clipped[mask].mean())
    assert np.isclose(metrics["ratio_mean"], ratio[mask].mean(), atol=1e-6)
    assert np.isclose(metrics["approx_kl"], (ratio - 1 - np.log(ratio))[mask].mean(), atol=1e-6)


def test_policy_loss_on_policy_and_masking():
    logp = jnp.log(jnp.full((2, 3), 0.5))
    mask = jnp.array([[True, True, False], [True, False, False]])
    loss, metrics = policy_loss(logp, logp, mask, jnp.array([1.0, -2.0]), 0.2)
    assert np.isclose(loss, -(1 + 1 - 2) / 3) and float(metrics["clip_frac"]) == 0.0
    assert float(metrics["approx_kl"]) == 0.0 and "kl_ref" not in metrics
    moved = logp.at[:, 2].set(5.0)  # masked tokens do not matter
    assert np.isclose(policy_loss(moved, logp, mask, jnp.array([1.0, -2.0]), 0.2)[0], loss)
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(logp, logp, mask, jnp.array([1.0, -2.0]), 0.2, kl_coef=0.1)


def test_entropy_and_predictor_loss():
    logits = jnp.zeros((2, 3, 4)).at[1].set(jnp.array([100.0, 0, 0, 0]))
    mask = jnp.array([[True, True, True], [True, False, False]])
    assert np.isclose(jax.jit(entropy)(policy_logprobs(logits), mask), 3 * np.log(4) / 4, atol=1e-5)
    # at temperature 2 the peaked row stays peaked (logit 50), the uniform rows stay uniform
    assert np.isclose(entropy(policy_logprobs(logits, 2.0), mask), 3 * np.log(4) / 4, atol=1e-5)
    soft = jnp.log(jnp.array([0.7, 0.1, 0.1, 0.1]))[None, None]
    hot = np.asarray(jax.nn.softmax(soft[0, 0] / 2.0))
    assert np.isclose(entropy(policy_logprobs(soft, 2.0), jnp.ones((1, 1), bool)), -(hot * np.log(hot)).sum())
    pred = jnp.array([[0.5, 0.2], [0.9, -1.0]])
    targets = jnp.array([[1.0, 0.0], [1.0, 0.0]])
    weight = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    assert np.isclose(jax.jit(predictor_loss)(pred, targets, weight), (0.25 + 0.04 + 0.01) / 3)


def test_calibration():
    pred = jnp.array([[0.05, 0.95, 0.95, 0.5], [0.05, 0.95, -1.0, 0.5]])
    targets = jnp.array([[0.0, 1.0, 0.0, 0.5], [0.0, 1.0, 1.0, 0.5]])
    weight = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    brier, ece = jax.jit(calibration)(pred, targets, weight)
    assert np.isclose(brier, (4 * 0.0025 + 0.9025) / 5)
    # bin 0: |0.1 - 0| ; bin 9: |2.85 - 2| (three 0.95s, targets 1, 1, 0)
    assert np.isclose(ece, (0.1 + 0.85) / 5)
    perfect = calibration(targets, targets, jnp.ones_like(targets))
    assert np.allclose(perfect, 0.0)
    assert np.isnan(calibration(pred, targets, jnp.zeros_like(weight))).all()  # no node: undefined, not perfect
    report = jax.jit(calibration_report)(pred, targets, weight)
    assert np.isclose(report["root_brier"], 0.0025) and np.isclose(report["root_ece"], 0.05)
    assert np.isclose(report["prefix_brier"], (2 * 0.0025 + 0.9025) / 3)
    roots_only = calibration_report(pred, targets, weight.at[:, 1:].set(0.0))
    assert np.isclose(roots_only["root_ece"], 0.05) and np.isnan(roots_only["prefix_ece"])


def test_ece_floor_is_the_binomial_expectation():
    """Two occupied bins (12 nodes at 0.15, 30 at 0.75) and masked nodes that must not count: the mean ECE over
    Bernoulli outcomes against the exact sum over binomial outcomes of each bin's |share won - prediction|."""
    pred = jnp.concatenate([jnp.full(12, 0.15), jnp.full(30, 0.75), jnp.full(20, 0.5)]).reshape(1, -1)
    weight = jnp.concatenate([jnp.ones(42), jnp.zeros(20)]).reshape(1, -1)  # counted, they would add 0.006

    def expected_gap(n: int, p: float) -> float:  # E |Binomial(n, p) / n - p|
        return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) * abs(k / n - p) for k in range(n + 1))

    exact = (12 * expected_gap(12, 0.15) + 30 * expected_gap(30, 0.75)) / 42
    floor = jax.jit(ece_floor, static_argnames="draws")(pred, weight, jax.random.key(1), draws=20_000)
    assert abs(float(floor) - exact) < 2e-3, (float(floor), exact)
    assert float(ece_floor(jnp.array([0.0, 1.0, 1.0]), jnp.ones(3), jax.random.key(1))) == 0.0  # certain outcomes


@pytest.mark.parametrize("seed", range(4))
def test_auc_matches_pairwise_counting(seed):
    """Against a brute-force count over all (positive, negative) pairs, with ties and masked entries."""
    rng = np.random.default_rng(seed)
    score = rng.choice([0.1, 0.3, 0.5, 0.5, 0.7, rng.uniform()], size=(6, 5)).astype(np.float32)
    label = rng.uniform(size=(6, 5)) < 0.4
    mask = rng.uniform(size=(6, 5)) < 0.8
    mask[0, 0] = False  # at least one masked entry
    pos, neg = score[mask & label], score[mask & ~label]
    expected = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert np.isclose(jax.jit(auc)(jnp.asarray(score), jnp.asarray(label), jnp.asarray(mask)), expected, atol=1e-6)
    assert np.isnan(auc(jnp.asarray(score), jnp.zeros((6, 5), bool), jnp.asarray(mask)))  # one class: undefined
    # a NaN read (a diverged predictor) under the mask makes it undefined too, not ranked; outside it, ignored
    nan_at = np.argwhere(mask)[0]
    assert np.isnan(auc(jnp.asarray(score).at[tuple(nan_at)].set(jnp.nan), jnp.asarray(label), jnp.asarray(mask)))
    ignored = jnp.asarray(score).at[0, 0].set(jnp.nan)
    assert np.isclose(auc(ignored, jnp.asarray(label), jnp.asarray(mask)), expected, atol=1e-6)


def test_weighted_auc_counts_each_node_its_weight_in_times():
    """Against pairwise counting over the nodes repeated by their weights (0: left out), with ties; all weights 1
    give `auc`."""
    rng = np.random.default_rng(0)
    score = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9], size=30).astype(np.float32)
    label = rng.uniform(size=30) < 0.4
    weight = rng.integers(0, 4, size=(5, 30))
    for w, got in zip(weight, weighted_auc(score, label, weight)):
        pos, neg = np.repeat(score[label], w[label]), np.repeat(score[~label], w[~label])
        assert np.isclose(got, np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))
    assert np.isclose(weighted_auc(score, label, np.ones((1, 30)))[0], auc(jnp.asarray(score), jnp.asarray(label),
                                                                           jnp.ones(30, bool)), atol=1e-6)
    assert np.isnan(weighted_auc(score, label, np.where(label, 0, 1)[None])[0])  # no positive left: undefined


def test_auc_interval_resamples_whole_questions():
    """Nodes of one question move together: repeating every node ten times within its question leaves the
    interval as it is (a resampling of nodes would narrow it ~3x), while ten times as many questions narrow it."""
    rng = np.random.default_rng(1)
    question = np.arange(40)
    score = rng.uniform(size=40)
    label = rng.uniform(size=40) < 0.3 + 0.4 * score
    lo, hi = auc_interval(score, label, question)
    point = float(auc(jnp.asarray(score), jnp.asarray(label), jnp.ones(40, bool)))
    assert lo < point < hi and hi - lo > 0.1
    assert auc_interval(np.repeat(score, 10), np.repeat(label, 10), np.repeat(question, 10)) == (lo, hi)
    many = np.arange(400)
    lo_many, hi_many = auc_interval(np.tile(score, 10), np.tile(label, 10), many)
    assert hi_many - lo_many < (hi - lo) / 2
    assert all(map(np.isnan, auc_interval(score, np.zeros(40, bool), question)))


def test_auc_past_two_to_the_31_pairs():
    """100k positives x 100k negatives (10^10 pairs): scores sorted with the labels give exactly 1, and one
    negative moved to the top costs exactly 1/n_neg of the pairs."""
    n = 100_000
    label = jnp.arange(2 * n) >= n  # the top half of the scores are the positives
    score = jnp.arange(2 * n, dtype=jnp.float32)
    assert float(auc(score, label, jnp.ones(2 * n, bool))) == pytest.approx(1.0, abs=1e-6)  # float32 sums
    assert float(auc(score.at[0].set(3 * n), label, jnp.ones(2 * n, bool))) == pytest.approx(1 - 1 / n, abs=1e-6)


def test_solve_rates_and_predictor_report():
    rates = {k: float(v) for k, v in solve_rates(HAND).items()}
    # prompt 7: leaves 1, 0, 0, 1 -> mixed; prompt 3: 0, 0, 1 -> mixed
    assert rates == {"solve_all": 0.0, "solve_none": 0.0, "solve_partial": 1.0}
    all_lost = make_tree(prompt=[0, 0, 1, 1], parent=[-1] * 4, branch_turn=[-1] * 4, num_turns=[1] * 4,
                         reward=[0, 0, 1, 1], success=np.array([[0.2, -1, -1, -1]] * 2 + [[0.9, -1, -1, -1]] * 2))
    rates = {k: float(v) for k, v in solve_rates(all_lost).items()}
    assert rates == {"solve_all": 0.5, "solve_none": 0.5, "solve_partial": 0.0}
    report = predictor_report(all_lost)
    assert float(report["root_auc"]) == 1.0 and np.isnan(report["prefix_auc"])  # no prefix reads
