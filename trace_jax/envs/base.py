"""The environment interface the rollout engine drives (batched over slots, static shapes)."""

from __future__ import annotations

from typing import Any, Protocol

import jax
import numpy as np


class JaxEnv(Protocol):
    """A JAX-native multi-turn environment, batched over S slots and traceable inside `jit`.

    Episodes follow the prompt -> (action, observation)* -> terminal reward protocol. Any action,
    however malformed, must yield a (possibly corrective) observation, never an error.
    """

    max_turns: int  # T: turns before an episode is cut off
    action_len: int  # A: policy tokens per turn at most
    obs_len: int  # O: observation tokens per turn at most
    stop_ids: tuple[int, ...]  # token ids that end a policy turn (optional: stop_sequences, see HostEnv)

    def reset(self, question_id: jax.Array) -> Any:
        """Per-slot env state for question ids [S]."""

    def at_turn(self, state: Any, turns: jax.Array) -> Any:
        """The state of the same episodes after `turns` [S] turns (live), for forking mid-episode."""

    def step(self, state: Any, action: jax.Array, action_len: jax.Array
             ) -> tuple[Any, jax.Array, jax.Array, jax.Array, jax.Array]:
        """(state, action [S, A], action_len [S]) -> (state, obs [S, O], obs_len [S], reward [S],
        done [S])."""


class HostEnv(Protocol):
    """A multi-turn environment on the host (tools: a retriever, a sandbox), batched over S slots.

    Stateless (the default): the episode's state is the slot's question and the turns it has taken, both read
    from the rollout tree, so forking a continuation mid-episode needs nothing from the environment.

    Stateful (`stateful = True`: a tool whose calls change state, such as a key-value store, a file system or an
    interpreter): `step` also gets `past_actions`, per slot the action token ids of every turn its episode took
    before this one, and must act on the state those actions leave. A continuation forked after turn t holds a
    copy of its parent's prefix, so its history is the parent's first t + 1 actions: the engine restores a fork
    by handing over that history, the environment by snapshot or replay (`envs.stateful.StatefulHostEnv`).
    """

    max_turns: int
    action_len: int
    obs_len: int
    stop_ids: tuple[int, ...]
    stop_sequences: tuple[tuple[int, ...], ...]  # multi-token stops, e.g. the ids of `</search>`
    # stateful: bool  (optional, False when absent) whether `step` takes `past_actions`

    def step(self, question: np.ndarray, turn: np.ndarray, live: np.ndarray, action: np.ndarray,
             action_len: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One turn of every live slot: question ids [S], turns taken before this one [S], live [S] bool,
        action [S, A] token ids, action_len [S] -> (obs [S, O], obs_len [S], reward [S], done [S]).
        Entries of slots that are not live are ignored. Must not raise on any action. A stateful env takes one
        more keyword, past_actions: a list (one per slot) of turn[s] int32 arrays [A_t], [] where not live."""
