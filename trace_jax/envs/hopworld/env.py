"""HopWorld as a batched `JaxEnv`: the pure-JAX step vmapped over slots."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from trace_jax.envs.hopworld import jax_env, protocol
from trace_jax.envs.hopworld.config import HopWorldConfig
from trace_jax.envs.hopworld.world import World


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HopWorldEnv:
    """The world's arrays travel as pytree data; the config is static."""

    world: World
    cfg: HopWorldConfig = dataclasses.field(metadata=dict(static=True))
    stop_ids: tuple[int, ...] = dataclasses.field(
        default=(protocol.SEARCH_END, protocol.ANSWER_END, protocol.EOS, protocol.IM_END),
        metadata=dict(static=True))

    @property
    def max_turns(self) -> int:
        return self.cfg.max_turns

    @property
    def action_len(self) -> int:
        return self.cfg.action_len

    @property
    def obs_len(self) -> int:
        return self.cfg.obs_len

    def reset(self, question_id: jax.Array) -> jax_env.EnvState:
        return jax.vmap(jax_env.reset, in_axes=(None, 0))(self.world, question_id)

    def at_turn(self, state: jax_env.EnvState, turns: jax.Array) -> jax_env.EnvState:
        return dataclasses.replace(state, turn=turns.astype(state.turn.dtype),
                                   done=jnp.zeros_like(state.done))

    def step(self, state, action, action_len):
        return jax.vmap(jax_env.step, in_axes=(None, None, 0, 0, 0))(
            self.world, self.cfg, state, action, action_len)
