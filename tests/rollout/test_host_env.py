"""The host-side tool path: the same per-turn step, compiled once, with observations from Python."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toy import TINY_POLICY, tiny_env, trained_policy
from trace_jax.allocation import Allocator, Plan
from trace_jax.envs.hopworld import protocol, reference
from trace_jax.evaluate import question_pool
from trace_jax.models.jit import jit_with_model
from trace_jax.rollout import expand as ex
from trace_jax.rollout.engine import SamplingConfig, TurnSpec, host_turn_fns, run_turns, run_turns_host
from trace_jax.rollout.host import expand_host
from trace_jax.sharding import init_policy

V, A, OBS, T = 24, 4, 3, 3
STOP, WIN = 1, 2  # token 1 ends a turn; an action containing token 2 wins and ends the episode
CFG = dataclasses.replace(TINY_POLICY, vocab_size=V)


class EchoHost:
    """Trivial tool on the host: observation = the first action token then the turn number."""

    max_turns, action_len, obs_len, stop_ids = T, A, OBS, (STOP,)

    def step(self, question, turn, live, action, action_len):
        win = np.array([(action[s, : action_len[s]] == WIN).any() for s in range(len(action))])
        done = win | (turn + 1 >= T)
        obs = np.zeros((len(action), OBS), np.int32)
        obs_len = np.where(done, 0, 2)
        obs[:, 0], obs[:, 1] = action[:, 0], 10 + turn
        return obs, obs_len, win.astype(np.float32), done


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EchoEnv:
    """The same tool as a JaxEnv, to check both paths agree."""

    max_turns: int = dataclasses.field(default=T, metadata=dict(static=True))
    action_len: int = dataclasses.field(default=A, metadata=dict(static=True))
    obs_len: int = dataclasses.field(default=OBS, metadata=dict(static=True))
    stop_ids: tuple = dataclasses.field(default=(STOP,), metadata=dict(static=True))

    def reset(self, q):
        return jnp.zeros_like(q)

    def at_turn(self, state, turns):
        return turns

    def step(self, turn, action, action_len):
        win = ((action == WIN) & (jnp.arange(A) < action_len[:, None])).any(1)
        done = win | (turn + 1 >= T)
        obs = jnp.zeros((action.shape[0], OBS), jnp.int32).at[:, 0].set(action[:, 0]).at[:, 1].set(10 + turn)
        return turn + 1, obs, jnp.where(done, 0, 2), win.astype(jnp.float32), done


def test_host_path_matches_the_in_trace_path():
    model = init_policy(CFG, seed=0)
    env = EchoEnv()
    pool = ex.Pool(tokens=jnp.array([[3, 4, 5], [6, 7, 0]]), lengths=jnp.array([3, 2]), question=jnp.arange(2))
    slots = jnp.array([0, 0, 1, 1, 1, 0], jnp.int32)
    keys = jax.random.split(jax.random.key(0), slots.shape[0])
    start = ex.start_roots(model, env, pool, ex.prefill_pool(model, pool), slots, keys, pad_id=0)
    sampling = SamplingConfig()

    in_trace = jit_with_model(run_turns, static_argnames=("sampling",))(model, env, start, sampling=sampling).tree

    generate, append = host_turn_fns(model, TurnSpec.of(env), sampling)
    on_host = run_turns_host(generate, append, EchoHost(), start).tree
    for a, b in zip(jax.tree.leaves(in_trace), jax.tree.leaves(on_host)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(on_host.done).all()
    compiled = (generate.func.cache_size(), append.func.cache_size())
    run_turns_host(generate, append, EchoHost(), start)
    assert (generate.func.cache_size(), append.func.cache_size()) == compiled  # every turn reuses one compilation


class HopWorldHost:
    """HopWorld's plain-Python reference env behind the `HostEnv` interface."""

    def __init__(self, env):
        self.world, self.cfg = env.world, env.cfg
        self.max_turns, self.action_len, self.obs_len = env.max_turns, env.action_len, env.obs_len
        self.stop_ids = env.stop_ids
        self.calls = []

    def step(self, question, turn, live, action, action_len):
        self.calls.append(int(live.sum()))
        s = len(question)
        obs, obs_len = np.zeros((s, self.obs_len), np.int32), np.zeros(s, np.int32)
        reward, done = np.zeros(s, np.float32), np.zeros(s, bool)
        for i in np.flatnonzero(live):
            state = dataclasses.replace(reference.reset(self.world, int(question[i])), turn=int(turn[i]))
            _, o, reward[i], done[i] = reference.step(self.world, self.cfg, state, action[i, : action_len[i]].tolist())
            obs[i, : len(o)], obs_len[i] = o, len(o)
        return obs, obs_len, reward, done


@pytest.mark.parametrize("allocator", ["trace", "grpo"])
def test_host_expansion_equals_the_jitted_expansion(allocator):
    """The whole tree (stage 1, forks mid-episode, stage 2) with the env on the host equals `expand` with the
    JAX env under the same key: same slots, tokens, readings and rewards."""
    model, env = trained_policy(), tiny_env()
    pool = question_pool(env, np.arange(6))
    plan = Plan(Allocator(allocator, group_size=2), roots=8, continuations=2 if allocator == "trace" else 0)
    key = jax.random.key(3)
    want, want_v, want_stats = ex.expand_tree(model, env, pool, key, plan=plan, sampling=SamplingConfig(0.7),
                                              pad_id=protocol.PAD)
    host = HopWorldHost(env)
    got, got_v, got_stats = expand_host(model, host, pool, key, plan=plan, sampling=SamplingConfig(0.7),
                                        pad_id=protocol.PAD)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(want_v), np.asarray(got_v))
    assert {k: int(v) for k, v in want_stats.items() if k != "utilisation"} == \
        {k: int(v) for k, v in got_stats.items() if k != "utilisation"}
    assert np.asarray(got.reward).any() and not np.asarray(got.reward).all()  # outcomes are mixed: a real check
    if allocator == "trace":
        assert np.asarray(got.is_continuation).any()  # forks happened mid-episode
    assert len(host.calls) <= 2 * env.max_turns and all(n > 0 for n in host.calls)  # one call per turn, live only
