"""The host-side tool path: the same per-turn step, compiled once, with observations from Python."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toy import TINY_POLICY, tiny_env, trained_policy
from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.config import MeshConfig
from trace_jax.envs.hopworld import protocol
from trace_jax.envs.hopworld.host import HopWorldHost
from trace_jax.evaluate import question_pool
from trace_jax.models.jit import jit_with_model
from trace_jax.rollout import expand as ex
from trace_jax.rollout.engine import (
    SamplingConfig,
    TurnSpec,
    append_observation_jit,
    generate_turn,
    generate_turn_jit,
)
from trace_jax.rollout.host import expand_host
from trace_jax.sharding import init_policy

OBS, T = 3, 3


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NoToolEnv:
    """Just enough of a JaxEnv to start root rollouts (`start_roots` resets it and reads its turn shape); the
    turns here are generated directly."""

    max_turns: int = dataclasses.field(default=T, metadata=dict(static=True))
    action_len: int = dataclasses.field(default=12, metadata=dict(static=True))
    obs_len: int = dataclasses.field(default=OBS, metadata=dict(static=True))
    stop_ids: tuple = dataclasses.field(default=(), metadata=dict(static=True))

    def reset(self, q):
        return jnp.zeros_like(q)


def test_host_expansion_equals_the_jitted_expansion():
    """The whole tree (stage 1, forks mid-episode, stage 2) with the env on the host equals `expand` with the
    JAX env under the same key: same slots, tokens, readings and rewards."""
    model, env = trained_policy(), tiny_env()
    pool = question_pool(env, np.arange(6))
    plan = Plan(Allocator("trace", group_size=2), roots=8, continuations=2)
    key = jax.random.key(3)
    want, want_v, want_stats = ex.expand_tree(model, env, pool, key, plan=plan, sampling=SamplingConfig(0.7),
                                              pad_id=protocol.PAD)
    host = HopWorldHost(env)
    got, got_v, got_stats = expand_host(model, host, pool, key, plan=plan, sampling=SamplingConfig(0.7),
                                        pad_id=protocol.PAD)
    for a, b in zip(jax.tree.leaves((want, want_v)), jax.tree.leaves((got, got_v))):
        if jnp.issubdtype(a.dtype, jnp.floating):  # log-probs and readings: two programs, float32 rounding apart
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)
        else:  # tokens, lengths, slots, turns: exactly
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert {k: int(v) for k, v in want_stats.items() if k != "utilisation"} == \
        {k: int(v) for k, v in got_stats.items() if k != "utilisation"}
    assert np.asarray(got.reward).any() and not np.asarray(got.reward).all()  # outcomes are mixed: a real check
    assert np.asarray(got.is_continuation).any()  # forks happened mid-episode
    calls = host.live_per_call  # one call per turn and phase, with live slots only
    assert len(calls) <= 2 * env.max_turns and all(n > 0 for n in calls)
    compiled = (generate_turn_jit.cache_size(), append_observation_jit.cache_size())
    expand_host(model, host, pool, jax.random.key(4), plan=plan, sampling=SamplingConfig(0.7), pad_id=protocol.PAD)
    assert (generate_turn_jit.cache_size(), append_observation_jit.cache_size()) == compiled  # compiled once
    # data parallel: each turn's slots split over 4 devices, the same tree, and its rows stay split
    mesh = shd.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:4])
    split, _, _ = expand_host(model, host, pool, key, plan=plan, sampling=SamplingConfig(0.7), pad_id=protocol.PAD,
                              mesh=mesh)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(split)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    for leaf in jax.tree.leaves(split):
        assert leaf.sharding.shard_shape(leaf.shape)[0] == leaf.shape[0] // 4, leaf.sharding


def _first_stop(action: np.ndarray, ids: tuple[int, ...], sequences: tuple[tuple[int, ...], ...]) -> int:
    """Plain-Python reference: tokens in the turn up to and including the first stop (or all of them)."""
    for k in range(len(action)):
        if action[k] in ids or any(k + 1 >= len(q) and tuple(action[k + 1 - len(q): k + 1]) == q for q in sequences):
            return k + 1
    return len(action)


def test_multi_token_stop_sequences_end_a_turn_where_the_sequence_completes():
    """Tokens at position p use fold_in(slot key, p): with stops added, each slot generates the same tokens up to
    the first completed stop sequence, then stops (the reference finds it in the unstopped turn)."""
    model = init_policy(dataclasses.replace(TINY_POLICY, vocab_size=8), seed=1)  # 8 tokens: repeats are common
    pool = ex.Pool(tokens=jnp.array([[3, 4, 5], [6, 7, 0]]), lengths=jnp.array([3, 2]), question=jnp.arange(2))
    slots = jnp.array([0, 1, 0, 1, 0, 1, 0, 1], jnp.int32)
    start = ex.start_roots(model, NoToolEnv(), pool, ex.prefill_pool(model, pool), slots,
                           jax.random.split(jax.random.key(5), 8), pad_id=0)
    free = TurnSpec(action_len=12, obs_len=OBS, max_turns=T, stop_ids=())
    _, action, action_len = jit_with_model(generate_turn, static_argnames=("spec", "sampling"))(
        model, start, spec=free, sampling=SamplingConfig())
    action = np.asarray(action)
    assert (np.asarray(action_len) == 12).all()
    ids, sequences = (7,), ((2, 3), (4, 4, 5))
    stopped = dataclasses.replace(free, stop_ids=ids, stop_sequences=sequences)
    _, got, got_len = jit_with_model(generate_turn, static_argnames=("spec", "sampling"))(
        model, start, spec=stopped, sampling=SamplingConfig())
    want_len = [_first_stop(row, ids, sequences) for row in action]
    assert np.asarray(got_len).tolist() == want_len
    assert len(set(want_len)) > 2 and min(want_len) < 12  # the stops really cut turns, at different places
    for row, n, full in zip(np.asarray(got), want_len, action):
        np.testing.assert_array_equal(row[:n], full[:n])
        assert (row[n:] == 0).all()
    with pytest.raises(ValueError, match="empty sequence"):
        dataclasses.replace(free, stop_sequences=((),))
