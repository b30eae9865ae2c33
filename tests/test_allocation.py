"""Allocation: exact stage-1/stage-2 solvers against brute force, slot layouts, every allocator."""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toy import make_tree
from trace_jax.allocation import (
    ALLOCATORS,
    Allocator,
    Plan,
    anchor_groups,
    anchors_to_slots,
    prefix_counts,
    repeat_chance,
    root_counts,
    root_slots,
    uniform_prefix_counts,
)
from trace_jax.rollout.tree import Tree
from trace_jax.solvers import SATURATION

root_counts_jit = jax.jit(root_counts, static_argnums=1)
prefix_counts_jit = jax.jit(prefix_counts, static_argnums=4)
V_SPECIAL = [0.0, 1.0, 0.5, 0.1, 0.9, 0.25, 0.75]


def as_solved(x: np.ndarray) -> np.ndarray:
    """Readings as the solvers take them: NaN as 0 (q: as 1), within SATURATION of 0 or 1 as exactly that (compared
    in float32: float32(1e-4) itself is not saturated), and readings of nothing but saturated ones as 0.5 everywhere
    (the uninformed spread)."""
    x = np.clip(np.nan_to_num(np.asarray(x, np.float32)), 0.0, 1.0)
    saturated = np.minimum(x, 1 - x) < np.float32(SATURATION)  # in float32, as the solvers decide it
    x = np.where(saturated, np.round(x), x).astype(np.float64)
    return np.full_like(x, 0.5) if saturated.all() else x


def stage1_value(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Objective of counts m [..., B]."""
    return np.where(m >= 2, 1 - v ** m - (1 - v) ** m, 0.0).sum(-1)


@functools.lru_cache
def feasible_counts(num_prompts: int, num_roots: int) -> np.ndarray:
    """[C, B] every count vector with sum M and no 1s."""
    grid = np.array(list(itertools.product(range(num_roots + 1), repeat=num_prompts)))
    return grid[(grid.sum(1) == num_roots) & ~(grid == 1).any(1)]


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 7), st.lists(st.one_of(st.sampled_from(V_SPECIAL), st.floats(0, 1, width=32)),
                                   min_size=1, max_size=4))
def test_root_counts_is_optimal(num_roots, v):
    v = np.asarray(v, np.float32)
    padded = np.concatenate([v, np.zeros(4 - len(v), np.float32)])  # v = 0 prompts are worth nothing
    m = np.asarray(root_counts_jit(jnp.asarray(padded), num_roots))
    assert m.sum() == num_roots and m.min() >= 0 and not (m == 1).any()
    solved = as_solved(padded)
    best = stage1_value(solved, feasible_counts(len(padded), num_roots)).max()
    assert stage1_value(solved, m) >= best - 1e-5


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 7), st.integers(2, 4), st.lists(st.one_of(st.sampled_from(V_SPECIAL), st.floats(0, 1, width=32)),
                                                      min_size=2, max_size=4))
def test_root_counts_with_a_cap_is_optimal(num_roots, cap, v):
    """No prompt gets more than max_per_prompt roots, and the value is the best of every such count vector."""
    v = np.asarray(v, np.float32)
    feasible = feasible_counts(len(v), num_roots)
    feasible = feasible[feasible.max(1) <= cap]
    if not len(feasible):
        with pytest.raises(ValueError, match="cannot place"):
            root_counts(jnp.asarray(v), num_roots, cap)
        return
    m = np.asarray(jax.jit(root_counts, static_argnums=(1, 2))(jnp.asarray(v), num_roots, cap))
    assert m.sum() == num_roots and m.max() <= cap and not (m == 1).any()
    assert stage1_value(as_solved(v), m) >= stage1_value(as_solved(v), feasible).max() - 1e-5


def test_root_counts_odd_budget_and_scale():
    m = np.asarray(root_counts_jit(jnp.array([0.5, 0.5, 0.5]), 5))
    assert sorted(m.tolist()) == [0, 2, 3]
    v = jax.random.uniform(jax.random.key(3), (64,))
    m_trace = np.asarray(root_counts_jit(v, 32))
    m_grpo = np.asarray(Allocator("grpo", group_size=4).roots(jax.random.key(0), v, 32))
    v = np.asarray(v, np.float64)
    assert m_trace.sum() == 32 and not (m_trace == 1).any()
    assert stage1_value(v, m_trace) > stage1_value(v, m_grpo)


def optimum(v: np.ndarray, num_roots: int) -> float:
    """Optimal stage-1 value by a plain float64 DP that pushes every count m of every prompt."""
    best = np.full(num_roots + 1, -np.inf)
    best[0] = 0.0
    for x in np.asarray(v, np.float64):
        new = best.copy()  # m = 0
        for m in range(2, num_roots + 1):
            new[m:] = np.maximum(new[m:], best[:num_roots + 1 - m] + 1 - x ** m - (1 - x) ** m)
        best = new
    return float(best[num_roots])


def check_root_counts(v: np.ndarray, m: np.ndarray, num_roots: int) -> None:
    assert m.sum() == num_roots and m.min() >= 0 and not (m == 1).any()
    assert abs(stage1_value(as_solved(v), m) - optimum(as_solved(v), num_roots)) <= 1e-5


@pytest.mark.parametrize("v, num_roots", [([0.16] * 7 + [0.56] * 3, 16), ([0.6633085] * 12, 9), ([0.16] * 7, 8),
                                          ([1e-4] + [0.0] * 63, 8)])
def test_root_counts_float32_regressions(v, num_roots):
    """Pools where float32 rounding broke the old concave-envelope + bounded-repair solver (eager or jitted), and
    one reading at float32(SATURATION), which is informed (the reference once decided it in float64)."""
    v = np.asarray(v, np.float32)
    check_root_counts(v, np.asarray(root_counts(jnp.asarray(v), num_roots)), num_roots)
    check_root_counts(v, np.asarray(root_counts_jit(jnp.asarray(v), num_roots)), num_roots)


V_TIES = [0.16, 0.56, 0.6633085, 0.0, 1.0, 0.5]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_root_counts_matches_float64_dp(data):
    """Up to 64 prompts sharing a few distinct v (ties everywhere), padded to 64 with v = 0: one compile per M."""
    num_roots = data.draw(st.sampled_from([3, 8, 9, 16, 24, 48]))
    distinct = (data.draw(st.lists(st.sampled_from(V_TIES), min_size=1, max_size=3))
                + data.draw(st.lists(st.floats(0, 1, width=32), max_size=1)))
    num_prompts = data.draw(st.integers(1, 64))
    picks = data.draw(st.lists(st.integers(0, len(distinct) - 1), min_size=num_prompts, max_size=num_prompts))
    v = np.asarray(distinct, np.float32)[picks]
    padded = np.concatenate([v, np.zeros(64 - len(v), np.float32)])  # v = 0 prompts are worth nothing
    check_root_counts(padded, np.asarray(root_counts_jit(jnp.asarray(padded), num_roots)), num_roots)


@pytest.mark.parametrize("bad", [0, 1, 2.0, True])
def test_root_counts_rejects_bad_budget(bad):
    with pytest.raises(ValueError, match="at least 2"):
        root_counts(jnp.array([0.5, 0.5]), bad)


def compositions(total: int, parts: int):
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in compositions(total - first, parts - 1):
            yield (first,) + rest


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_prefix_counts_is_optimal(data):
    """Random instances up to R = T = G = 3, padded to that shape (one compilation)."""
    r, t, g = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    q = np.array(data.draw(st.lists(st.one_of(st.sampled_from(V_SPECIAL), st.floats(0, 1, width=32)),
                                    min_size=9, max_size=9)), np.float32).reshape(3, 3)
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=9, max_size=9))).reshape(3, 3)
    valid[r:], valid[:, t:] = False, False
    group = np.array(data.draw(st.lists(st.integers(-1, g - 1), min_size=3, max_size=3)), np.int32)
    budget = np.array(data.draw(st.lists(st.integers(0, 4), min_size=3, max_size=3)), np.int32)
    budget[g:] = 0
    k, unspent = (np.asarray(x) for x in prefix_counts_jit(jnp.asarray(q), jnp.asarray(valid), jnp.asarray(group),
                                                          jnp.asarray(budget), 4))
    usable = valid & (group >= 0)[:, None]
    assert (k[~usable] == 0).all()
    for gi in range(3):
        cells = usable & (group == gi)[:, None]
        n = int(cells.sum())
        assert unspent[gi] == (budget[gi] if n == 0 else 0)
        if n == 0:
            continue
        assert k[cells].sum() == budget[gi]
        qs = as_solved(np.nan_to_num(q[cells], nan=1.0))
        best = max(np.sum(1 - qs ** np.array(c)) for c in compositions(int(budget[gi]), n))
        assert np.sum(1 - qs ** k[cells]) >= best - 1e-5


def test_a_saturated_predictor_spreads_the_budget_as_an_uninformed_one():
    """V~ 0 or 1 on a whole pool (or a whole group's anchors), or NaN, makes every allocation worth 0: the solvers
    then spread as at V~ = 0.5, where their tie-breaks would put all M roots on prompt 0 and a group's budget on its
    first anchor. One informative prompt or anchor is enough to be solved as it is."""
    uninformed = np.asarray(root_counts_jit(jnp.full(6, 0.5), 8))
    assert sorted(uninformed.tolist()) == [0, 0, 0, 2, 3, 3]
    for v in ([0.0] * 6, [1.0] * 6, [0.0, 1.0] * 3, [float("nan")] * 6):
        assert np.asarray(root_counts_jit(jnp.asarray(v, jnp.float32), 8)).tolist() == uninformed.tolist(), v
    assert np.asarray(root_counts_jit(jnp.asarray([1.0] * 5 + [0.7]), 8)).tolist() == [0, 0, 0, 0, 0, 8]
    # stage 2: group 0's anchors all at q = 1 spread round-robin; group 1 has one anchor that can flip
    q = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.5]])
    valid, group = jnp.ones((2, 3), bool), jnp.array([0, 1])
    k, unspent = prefix_counts_jit(q, valid, group, jnp.array([6, 2]), 6)
    assert np.asarray(k).tolist() == [[2, 2, 2], [0, 0, 2]] and np.asarray(unspent).tolist() == [0, 0]
    k, _ = prefix_counts_jit(jnp.full((2, 3), jnp.nan), valid, group, jnp.array([6, 2]), 6)
    assert np.asarray(k).tolist() == [[2, 2, 2], [1, 1, 0]]


@pytest.mark.parametrize("logits", [-jnp.arange(20.0, 26.0), jnp.arange(20.0, 26.0), jnp.array([-30.0, 25.0] * 3)])
def test_a_head_stuck_near_0_or_1_spreads_like_an_uninformed_one(logits):
    """Readings like sigmoid(-20) are never exactly 0, yet float32 cannot tell spreading roots from piling them
    there: stage 1 solves such a pool as at V~ = 0.5, not with all M roots on one prompt."""
    uninformed = np.asarray(root_counts_jit(jnp.full(6, 0.5), 8)).tolist()
    assert np.asarray(root_counts_jit(jax.nn.sigmoid(logits), 8)).tolist() == uninformed
    informative = jax.nn.sigmoid(logits).at[4].set(0.6)  # one prompt that can go either way takes them all
    assert np.asarray(root_counts_jit(informative, 8)).tolist() == [0, 0, 0, 0, 8, 0]


@pytest.mark.parametrize("q", [0.0, 1e-9, 1.0 - 1e-9])
def test_a_root_its_head_was_sure_of_and_that_went_the_other_way_spreads_its_continuations(q):
    """V~ = 1.0 at every turn of a root that lost gives q = 0 at every anchor (each continuation surely flips):
    after one continuation per anchor every gain is 0, and the tie-break would pile the rest on the first anchor.
    Saturated near 0 or near 1 alike, the group is solved as at q = 0.5: spread evenly."""
    valid, group = jnp.ones((1, 3), bool), jnp.array([0])
    k, unspent = prefix_counts_jit(jnp.full((1, 3), q), valid, group, jnp.array([6]), 6)
    assert np.asarray(k).tolist() == [[2, 2, 2]] and int(unspent[0]) == 0


def test_stage_1_reads_a_nan_among_informative_readings_as_no_contrast():
    """NaN V~ (a reading that failed) is worth nothing beside informative ones: read as 0.5 it would be the most
    promising prompt of this pool and take the roots."""
    v = jnp.array([jnp.nan, 0.8, jnp.nan, 0.9, 0.95, jnp.nan])
    m = np.asarray(root_counts_jit(v, 6)).tolist()
    assert m[0] == m[2] == m[5] == 0 and sum(m) == 6


def test_the_default_per_anchor_cap_never_binds():
    """With max_per_anchor unset, one anchor can take a prompt's whole stage-2 budget: prompt 0's two roots have a
    single usable anchor between them (root 1 took one turn), and all m * N = 6 continuations go there."""
    tree = root_tree(prompt=[0, 0], num_turns=[2, 1], reward=[1, 0], num_cont=0)
    k, unplaced = Allocator("trace").prefixes(jax.random.key(0), tree, jnp.array([2]), 3)
    assert np.asarray(k).tolist() == [[6, 0, 0], [0, 0, 0]] and np.asarray(unplaced).tolist() == [0]


def test_prefix_counts_reports_what_it_cannot_place():
    q = jnp.array([[0.5, 0.5], [0.2, 0.9]])
    valid = jnp.array([[True, False], [False, False]])
    k, unspent = prefix_counts_jit(q, valid, jnp.array([0, 1]), jnp.array([5, 3]), 2)
    assert np.asarray(k).tolist() == [[2, 0], [0, 0]] and np.asarray(unspent).tolist() == [3, 3]
    with pytest.raises(ValueError, match="negative"):
        prefix_counts(q, valid, jnp.array([0, 1]), jnp.array([-1, 3]), 2)
    with pytest.raises(ValueError, match="shapes"):
        prefix_counts(q, valid[:1], jnp.array([0, 1]), jnp.array([1, 3]), 2)


def test_root_slots_and_anchor_slots():
    assert np.asarray(root_slots(jnp.array([0, 2, 0, 3]), 5)).tolist() == [1, 1, 3, 3, 3]
    with pytest.raises(ValueError, match="sums to 4"):
        root_slots(jnp.array([2, 2]), 5)
    with pytest.raises(ValueError, match="negative"):
        root_slots(jnp.array([-1, 6]), 5)
    k = jnp.array([[1, 0, 2], [0, 0, 0]])
    parent, turn = anchors_to_slots(k, 2, 2)
    assert np.asarray(parent).tolist() == [0, 0, 0, -1] and np.asarray(turn).tolist() == [0, 2, 2, -1]
    with pytest.raises(ValueError, match="at most 4"):
        anchors_to_slots(k + 1, 2, 2)
    with pytest.raises(ValueError, match="must be"):
        anchors_to_slots(k, 3, 2)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_anchor_slots_round_trip(counts):
    k = np.array(counts, np.int32).reshape(3, 2)
    parent, turn = jax.jit(anchors_to_slots, static_argnums=(1, 2))(jnp.asarray(k), 3, 6)
    parent, turn = np.asarray(parent), np.asarray(turn)
    back = np.zeros_like(k)
    np.add.at(back, (parent[parent >= 0], turn[parent >= 0]), 1)
    assert (back == k).all() and (parent[k.sum():] == -1).all()


def root_tree(prompt, num_turns, reward, num_cont, turns=3, seed=0) -> Tree:
    """A tree whose root slots [0, M) are finished (random readings up to num_turns); continuations empty."""
    m = len(prompt)
    s = m * (1 + num_cont)

    def pad(x, fill):
        return np.concatenate([np.asarray(x), np.full(s - m, fill, np.asarray(x).dtype)])

    num_turns = pad(np.asarray(num_turns, np.int32), 0)
    success = np.random.default_rng(seed).uniform(size=(s, turns + 1)).astype(np.float32)
    success[np.arange(turns + 1) > num_turns[:, None]] = Tree.NO_READING
    return make_tree(pad(np.asarray(prompt, np.int32), Tree.NO_PROMPT), num_turns,
                     pad(np.asarray(reward, np.float32), 0.0), success=success, turns=turns)


# pool of 5 prompts; prompt 1 has 3 roots, prompt 3 two, prompt 4 one root with a single turn (no anchor)
M, N, POOL = 6, 2, 5
M_COUNTS = jnp.array([0, 3, 0, 2, 1])
TREE = root_tree(prompt=[1, 1, 1, 3, 3, 4], num_turns=[3, 2, 1, 3, 3, 1], reward=[1, 0, 1, 0, 0, 1], num_cont=N)
ROOTS = jax.tree.map(lambda a: a[:M], TREE)  # what stage 2 sees: the finished root slots


def test_anchor_groups_and_repeat_chance():
    valid, group = anchor_groups(TREE, M)
    assert np.asarray(valid).tolist() == [[True, True, False], [True, False, False], [False] * 3,
                                          [True, True, False], [True, True, False], [False] * 3]
    assert np.asarray(group).tolist() == [1, 1, 1, 3, 3, 4]
    q, v = np.asarray(repeat_chance(TREE, M)), np.asarray(TREE.success[:M, 1:])
    assert np.allclose(q[0, :2], v[0, :2]) and np.allclose(q[1, :1], 1 - v[1, :1])


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_allocators_fill_budgets_under_jit(name):
    alloc = Allocator(name, group_size=2)
    key = jax.random.key(1)
    v_pool = jnp.array([0.5, 0.9, 0.45, 0.0, 0.6])
    m = np.asarray(jax.jit(alloc.roots, static_argnums=2)(key, v_pool, M))
    assert m.sum() == M and not (m == 1).any()
    if alloc.root_rule == "uniform":
        assert sorted(m.tolist()) == [0, 0, 2, 2, 2]
    if alloc.root_rule == "pcl":
        assert m.tolist() == [2, 0, 2, 0, 2]
    plan = Plan(alloc, roots=M, continuations=N)
    parent, turn, unplaced = (np.asarray(x) for x in jax.jit(plan.continuation_slots)(key, ROOTS, M_COUNTS))
    assert parent.shape == turn.shape == (M * N,)
    if not alloc.uses_prefixes:
        assert (parent == -1).all() and (turn == -1).all() and unplaced == 0
        return
    assert unplaced == 2  # prompt 4's budget (1 root x N) has no anchor: reported, not silently lost
    valid, group = (np.asarray(x) for x in anchor_groups(TREE, M))
    used = parent >= 0
    assert valid[parent[used], turn[used]].all()
    per_prompt = np.bincount(group[parent[used]], minlength=POOL)
    assert per_prompt.tolist() == [0, 6, 0, 4, 0]  # prompt 4's budget 2 has no anchor: left unused
    if alloc.prefix_rule == "uniform":
        counts = np.zeros((M, 3), int)
        np.add.at(counts, (parent[used], turn[used]), 1)
        assert counts[valid & (group == 1)[:, None]].tolist() == [2, 2, 2]
        assert sorted(counts[valid & (group == 3)[:, None]].tolist()) == [1, 1, 1, 1]


def test_trace_prefixes_prefer_uncertain_anchors():
    tree = root_tree(prompt=[0, 0], num_turns=[3, 3], reward=[1, 0], num_cont=0)
    success = tree.success.at[0, 1:3].set(jnp.array([0.99, 0.5])).at[1, 1:3].set(jnp.array([0.6, 0.999]))
    tree = dataclasses.replace(tree, success=success)
    plan = Plan(Allocator("trace"), roots=2, continuations=1)
    parent, turn, _ = jax.jit(plan.continuation_slots)(jax.random.key(0), tree, jnp.array([2]))
    # q: root 0 (won) [0.99, 0.5]; root 1 (lost) [0.4, 0.001]: best single gains go to (1,1) and (1,0)
    assert sorted(zip(np.asarray(parent).tolist(), np.asarray(turn).tolist())) == [(1, 0), (1, 1)]


def test_uniform_prefix_counts_spread_evenly():
    valid = jnp.ones((2, 3), bool)
    noise = jax.random.uniform(jax.random.key(0), (6,))
    k, unspent = uniform_prefix_counts(noise, valid, jnp.array([0, 1]), jnp.array([7, 0]))
    assert sorted(np.asarray(k)[0].tolist()) == [2, 2, 3] and (np.asarray(k)[1] == 0).all()
    assert np.asarray(unspent).tolist() == [0, 0]


def test_allocator_errors():
    with pytest.raises(ValueError, match="unknown allocator"):
        Allocator("tree_of_thought")
    with pytest.raises(ValueError, match="group_size"):
        Allocator("grpo")
    with pytest.raises(ValueError, match="must divide"):
        Allocator("grpo", group_size=4).roots(jax.random.key(0), jnp.zeros(5), M)
    with pytest.raises(ValueError, match="must divide"):
        Allocator("pcl", group_size=1).roots(jax.random.key(0), jnp.zeros(5), M)
    with pytest.raises(ValueError, match="must be >= 0"):
        Allocator("trace").prefixes(jax.random.key(0), ROOTS, M_COUNTS, -1)
    with pytest.raises(ValueError, match="sums to"):
        Allocator("trace").prefixes(jax.random.key(0), ROOTS, M_COUNTS + 1, N)
    with pytest.raises(ValueError, match="max_per_anchor"):
        Allocator("trace", max_per_anchor=0)
