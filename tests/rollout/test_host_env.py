"""The host-side tool path: the same per-turn step, compiled once, with observations from Python."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from toy import TINY_POLICY
from trace_jax.models.jit import jit_with_model
from trace_jax.rollout import expand as ex
from trace_jax.rollout.engine import SamplingConfig, TurnSpec, host_turn_fns, run_turns, run_turns_host
from trace_jax.sharding import init_policy

V, A, OBS, T = 24, 4, 3, 3
STOP, WIN = 1, 2  # token 1 ends a turn; an action containing token 2 wins and ends the episode
CFG = dataclasses.replace(TINY_POLICY, vocab_size=V)


def host_step(turn: np.ndarray, live, action, action_len):
    """Trivial tool: observation = the first action token then the turn number (turn+1 tokens)."""
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

    turn = np.zeros(slots.shape[0], np.int32)

    def step(live, action, action_len):
        nonlocal turn
        out = host_step(turn, live, action, action_len)
        turn = turn + live
        return out

    generate, append = host_turn_fns(model, TurnSpec.of(env), sampling)
    on_host = run_turns_host(generate, append, step, start, T).tree
    for a, b in zip(jax.tree.leaves(in_trace), jax.tree.leaves(on_host)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.asarray(on_host.done).all()
    assert generate.func.cache_size() == 1 and append.func.cache_size() == 1
