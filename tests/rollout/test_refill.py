"""Slot refill samples the synchronous engine's tree under the same key, slot for slot, on fewer live rows: with
the environment in JAX and on the host, at the sampling knobs (GRPO's N = 0 path runs refilled in
tests/test_compare.py); stage 2 of a prefix of prompts is the whole step's
for every stage-2 rule. (That a refilled training step is the synchronous one: tests/train/test_train.py, whose
single-device step refills and whose sharded step does not.)"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toy import make_tree, tiny_env, trained_policy
from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.config import MeshConfig, TrainConfig, load_config
from trace_jax.envs.hopworld import protocol
from trace_jax.envs.hopworld.host import HopWorldHost
from trace_jax.evaluate import question_pool
from trace_jax.rollout import expand as ex
from trace_jax.rollout import refill
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.host import expand_host_refilled
from trace_jax.rollout.tree import Tree
from trace_jax.train.loop import refill_rows

B = 6
CASES = {
    # capped anchors leave budget unplaced, so later prompts' continuation slots (and keys) shift
    "trace": (Plan(Allocator("trace", max_per_anchor=1), roots=8, continuations=3), 4, SamplingConfig(0.7, 0.9)),
}


@pytest.fixture(scope="module")
def env():
    return tiny_env()


@pytest.fixture(scope="module")
def model():
    return trained_policy()  # peaked next-token distributions: episodes of different lengths, a wrong row shows


def assert_same_tree(a, b) -> None:
    a, b = jax.device_get((a, b))
    for name in ("tokens", "policy_mask", "length", "prompt_len", "boundaries", "num_turns", "prompt", "question",
                 "parent", "branch_turn", "done", "reward", "model_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in ("logprobs", "success"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=1e-5, err_msg=name)


def _sampled_tokens(tree) -> int:
    """Policy tokens the slots sampled themselves (a continuation's copied prefix excluded)."""
    own = np.arange(tree.max_len) >= np.asarray(tree.start)[:, None]
    return int((own & np.asarray(tree.policy_mask)).sum())


@pytest.mark.parametrize("case", sorted(CASES))
def test_refill_samples_the_synchronous_tree(env, model, case):
    plan, live_slots, sampling = CASES[case]
    pool = question_pool(env, np.arange(B))
    kwargs = dict(plan=plan, sampling=sampling, pad_id=protocol.PAD)
    sync, sync_v, sync_stats = ex.expand_tree(model, env, pool, jax.random.key(7), **kwargs)
    before = refill.expand_refilled.cache_size()
    tree, pool_v, stats = refill.expand_refilled(model, env, pool, jax.random.key(7), live_slots=live_slots, **kwargs)
    assert_same_tree(sync, tree)
    np.testing.assert_allclose(pool_v, sync_v, atol=1e-6)
    assert int(stats["stage2_unplaced"]) == int(sync_stats["stage2_unplaced"])
    if case == "trace":
        assert int(stats["stage2_unplaced"]) > 0, "the case meant to shift continuation slots placed everything"
    # the same sampled tokens on live_slots rows: utilisation is over those rows' decode steps
    assert int(stats["live_tokens"]) == int(sync_stats["live_tokens"]) == _sampled_tokens(jax.device_get(tree))
    assert float(stats["utilisation"]) == pytest.approx(
        int(stats["live_tokens"]) / (live_slots * int(stats["decode_steps"])))
    assert float(stats["utilisation"]) > float(sync_stats["utilisation"])
    other, _, _ = refill.expand_refilled(model, env, question_pool(env, np.arange(B, 2 * B)), jax.random.key(8),
                                         live_slots=live_slots, **kwargs)
    assert bool(other.used.any())
    assert refill.expand_refilled.cache_size() - before <= 1  # compiles once per shapes


def test_refill_on_the_host_answers_only_running_rows(env, model):
    plan, live_slots, sampling = CASES["trace"]
    pool = question_pool(env, np.arange(B))
    kwargs = dict(plan=plan, sampling=sampling, pad_id=protocol.PAD)
    sync, _, _ = ex.expand_tree(model, env, pool, jax.random.key(7), **kwargs)  # = expand_host (test_host_env)
    host = HopWorldHost(env)
    tree, _, stats = expand_host_refilled(model, host, pool, jax.random.key(7), live_slots=live_slots, **kwargs)
    assert_same_tree(sync, tree)
    assert max(host.live_per_call) <= live_slots
    # every turn of every slot answered exactly once: a root's turns, a continuation's turns after its anchor
    t = jax.device_get(tree)
    own_turns = np.where(t.is_continuation, t.num_turns - t.branch_turn - 1, t.num_turns)[t.used]
    assert sum(host.live_per_call) == own_turns.sum()
    assert float(stats["utilisation"]) > 0


@pytest.mark.parametrize("allocator", [Allocator("trace", max_per_anchor=2), Allocator("uniform_tree", group_size=2),
                                       Allocator("random_tree", group_size=2)])
def test_stage_2_of_the_first_prompts_is_the_whole_steps(allocator):
    """What refill releases as prompts finish in order: for every prefix of whole prompts, the first entries of the
    whole step's (parent, branch_turn), the rest unused; all prompts: the whole step's, unplaced budget included."""
    rng = np.random.default_rng(1)
    prompt = np.array([0, 0, 1, 1, 1, 3, 3, 4, 4, 4])  # prompts 2 and 5 of the pool got no roots
    m = jnp.asarray(np.bincount(prompt, minlength=6))
    turns = rng.integers(2, 4, len(prompt))
    turns[5:7] = 1  # prompt 3's episodes ended after one turn: no anchor, its budget goes unplaced
    success = np.where(np.arange(4) <= turns[:, None], rng.uniform(size=(len(prompt), 4)), Tree.NO_READING)
    roots = make_tree(prompt, turns, rng.integers(0, 2, len(prompt)), success=success)
    plan, key = Plan(allocator, roots=len(prompt), continuations=2), jax.random.key(3)
    parent, branch_turn, unplaced = plan.continuation_slots(key, roots, m)
    assert int(unplaced) > 0  # so prompt 4's continuation slots come right after prompt 1's
    solve = jax.jit(refill.solve_prefix, static_argnums=0)  # traced, as in refill.settle (m is a prefix's counts)
    for solved in (0, 2, 5, 7, 10):
        p, b, u = solve(plan, key, roots, m, jnp.int32(solved))
        n = int((p != Tree.NO_PARENT).sum())
        assert n == 0 or int(p[n - 1]) < solved
        np.testing.assert_array_equal(p[:n], parent[:n])
        np.testing.assert_array_equal(b[:n], branch_turn[:n])
        if solved == 10:
            np.testing.assert_array_equal(p, parent)
            assert int(u) == int(unplaced)
        else:
            assert int(parent[n]) >= solved  # the next entry belongs to a later prompt


def test_refill_rows_and_options():
    """-1 (the default): 4 live rows per data-parallel device on a CPU, none with chunks; 0 and S_live as given."""
    auto = TrainConfig()
    assert auto.refill_slots == -1 and jax.default_backend() == "cpu"
    assert refill_rows(auto) == 4
    assert refill_rows(auto, shd.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:4])) == 16
    assert refill_rows(dataclasses.replace(auto, chunk_slots=48)) == 0
    assert refill_rows(dataclasses.replace(auto, refill_slots=0)) == 0
    assert refill_rows(load_config(TrainConfig, None, ["refill_slots=6"])) == 6
    with pytest.raises(ValueError, match="refill_slots >= -1"):
        TrainConfig(refill_slots=-2)
    with pytest.raises(ValueError, match="chunk_slots=12 and train.refill_slots=5: set one"):
        load_config(TrainConfig, None, ["refill_slots=5", "chunk_slots=12"])
