"""A toy tool whose calls change state: a counter the policy moves towards a target, then submits.

The counter lives only in the environment (`StatefulHostEnv`), so a continuation forked mid-episode sees the right
value only if its state is restored from its history. The vocabulary is a few token ids, so that a tiny random
policy over it (`vocab_size`) makes calls often.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from trace_jax.envs.stateful import StatefulHostEnv
from trace_jax.rollout.expand import Pool

PAD = 0  # HopWorld's pad id, never produced here
INC, DEC, SUBMIT = 1, 2, 3  # the calls: counter += 1, counter -= 1 (not below 0), end the episode
ERROR = 4  # first token of the observation of a malformed call (or a failed tool)
GOAL = 5  # a prompt is GOAL, VALUE + target
VALUE = 6  # VALUE + v is the number v, 0 <= v <= max_turns


class CounterEnv(StatefulHostEnv):
    """Question q asks for the count targets[q]. A turn ends at its first call token (or after action_len
    tokens); a turn whose first token is a call makes it, any other is malformed. Every observation shows the
    counter; SUBMIT, or the last turn, ends the episode: reward 1 iff the counter equals the target."""

    def __init__(self, targets: Sequence[int], max_turns: int = 4, cache_size: int = 4096):
        super().__init__(cache_size)
        self.targets = [int(t) for t in targets]
        self.max_turns, self.action_len, self.obs_len = max_turns, 3, 2
        self.stop_ids = (INC, DEC, SUBMIT)
        self.vocab_size = VALUE + max_turns + 1

    def fresh(self, question: int) -> dict[str, int]:
        return {"count": 0}

    def act(self, state: dict[str, int], question: int, turn: int, action: np.ndarray
            ) -> tuple[np.ndarray, float, bool]:
        call = int(action[0]) if len(action) else None
        if call in self.stop_ids:
            state["count"] = max(state["count"] + {INC: 1, DEC: -1, SUBMIT: 0}[call], 0)
            obs = [VALUE + state["count"]]
        else:  # malformed: said so, the counter unchanged
            obs = [ERROR, VALUE + state["count"]]
        done = call == SUBMIT or turn + 1 >= self.max_turns
        return np.array(obs), float(done and state["count"] == self.targets[question]), done

    def error_observation(self, exc: Exception) -> np.ndarray:
        return np.array([ERROR, ERROR])

    def pool(self, questions: Sequence[int]) -> Pool:
        """A rollout pool of `questions`: prompts [B, 2] (GOAL, VALUE + target), lengths [B], question ids [B]."""
        tokens = [[GOAL, VALUE + self.targets[q]] for q in questions]
        return Pool(tokens=jnp.asarray(tokens, jnp.int32), lengths=jnp.full(len(questions), 2, jnp.int32),
                    question=jnp.asarray(questions, jnp.int32))
