"""Slot refill samples the synchronous engine's tree under the same key, slot for slot, on fewer live rows: with
the environment in JAX and on the host, for TRACE's solver and the random stage-2 rules, at the sampling knobs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toy import tiny_env, trained_policy, trained_policy_state
from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.config import MeshConfig, TrainConfig, load_config
from trace_jax.envs.hopworld import protocol
from trace_jax.envs.hopworld.host import HopWorldHost
from trace_jax.evaluate import question_pool
from trace_jax.rollout import expand as ex
from trace_jax.rollout import refill
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.host import expand_host, expand_host_refilled
from trace_jax.train.loop import Budget, initial_state, refill_rows, step_spec
from trace_jax.train.step import build_step, make_optimizer

B = 6
CASES = {
    # capped anchors leave budget unplaced, so later prompts' continuation slots (and keys) shift
    "trace": (Plan(Allocator("trace", max_per_anchor=1), roots=8, continuations=3), 4, SamplingConfig(0.7, 0.9)),
    "random_tree": (Plan(Allocator("random_tree", group_size=2), roots=8, continuations=2), 13, SamplingConfig()),
    "grpo": (Plan(Allocator("grpo", group_size=4), roots=8, continuations=0), 3, SamplingConfig(1.3)),
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
    # the same useful tokens on live_slots rows: utilisation is over those rows' decode steps
    assert int(stats["live_tokens"]) == int(sync_stats["live_tokens"]) == _sampled_tokens(tree)
    assert float(stats["utilisation"]) == pytest.approx(
        int(stats["live_tokens"]) / (live_slots * int(stats["decode_steps"])))
    other, _, _ = refill.expand_refilled(model, env, question_pool(env, np.arange(B, 2 * B)), jax.random.key(8),
                                         live_slots=live_slots, **kwargs)
    assert bool(other.used.any())
    assert refill.expand_refilled.cache_size() - before <= 1  # compiles once per shapes


def _sampled_tokens(tree) -> int:
    """Policy tokens the slots sampled themselves (a continuation's copied prefix excluded)."""
    own = np.arange(tree.max_len) >= np.asarray(tree.start)[:, None]
    return int((own & np.asarray(tree.policy_mask)).sum())


def test_refill_on_the_host_answers_only_running_rows(env, model):
    plan, live_slots, sampling = CASES["trace"]
    pool = question_pool(env, np.arange(B))
    kwargs = dict(plan=plan, sampling=sampling, pad_id=protocol.PAD)
    sync, _, _ = expand_host(model, HopWorldHost(env), pool, jax.random.key(3), **kwargs)
    host = HopWorldHost(env)
    tree, _, stats = expand_host_refilled(model, host, pool, jax.random.key(3), live_slots=live_slots, **kwargs)
    assert_same_tree(sync, tree)
    assert max(host.live_per_call) <= live_slots
    # every turn of every slot answered exactly once: a root's turns, a continuation's turns after its anchor
    t = jax.device_get(tree)
    own_turns = np.where(t.is_continuation, t.num_turns - t.branch_turn - 1, t.num_turns)[t.used]
    assert sum(host.live_per_call) == own_turns.sum()
    assert float(stats["utilisation"]) > 0


def test_a_training_step_on_refilled_rows_is_the_synchronous_step():
    """`refill_slots` reaches the compiled step (and `trace-jax train`'s config): the same update and metrics but the
    engine's own (utilisation and what was fed, measured over the live rows)."""
    graphdef, params = trained_policy_state()
    tx = make_optimizer(1e-3, 1.0, head_learning_rate=1e-2)
    cfg = load_config(TrainConfig, None, ["roots=8", "continuations=2", "refill_slots=5", "temperature=0.8"])
    spec = step_spec(cfg, Budget(8, 2, cfg.group_size))
    assert spec.refill_slots == 5
    env, pool = tiny_env(), question_pool(tiny_env(), np.arange(B))
    out = {}
    for name, s in (("sync", dataclasses.replace(spec, refill_slots=0)), ("refill", spec)):
        state = initial_state(cfg, jax.tree.map(jnp.copy, params), tx)
        new, out[name] = build_step(graphdef, tx, s)(state, env, pool, jax.random.key(4))
    engine = ("utilisation", "fed_positions", "decode_steps", "slot_steps")
    assert out["sync"].keys() == out["refill"].keys()
    for k in out["sync"]:
        if k not in engine:
            np.testing.assert_allclose(out["refill"][k], out["sync"][k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(out["refill"]["utilisation"]) > float(out["sync"]["utilisation"])
    with pytest.raises(ValueError, match="chunk_slots=12 and train.refill_slots=5: set one"):
        load_config(TrainConfig, None, ["refill_slots=5", "chunk_slots=12"])


def test_auto_refill_rows():
    """-1 (the default): 4 live rows per data-parallel device on a CPU, none with chunks; 0 and S_live as given."""
    auto = TrainConfig()
    assert auto.refill_slots == -1 and jax.default_backend() == "cpu"
    assert refill_rows(auto) == 4
    assert refill_rows(auto, shd.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:4])) == 16
    assert refill_rows(dataclasses.replace(auto, chunk_slots=48)) == 0
    assert refill_rows(dataclasses.replace(auto, refill_slots=0)) == 0
    assert refill_rows(dataclasses.replace(auto, refill_slots=6)) == 6
    with pytest.raises(ValueError, match="refill_slots >= -1"):
        TrainConfig(refill_slots=-2)
