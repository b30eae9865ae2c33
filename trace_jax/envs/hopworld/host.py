"""HopWorld's plain-Python reference env behind the `HostEnv` interface: the same episodes as the JAX env,
through the host path. It checks (tests) and measures (`trace-jax bench host`) that path against the
jitted one."""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from trace_jax.envs.hopworld import reference
from trace_jax.envs.hopworld.env import HopWorldEnv


class HopWorldHost:
    def __init__(self, env: HopWorldEnv):
        self.world, self.cfg = env.world, env.cfg
        self.max_turns, self.action_len, self.obs_len = env.max_turns, env.action_len, env.obs_len
        self.stop_ids = env.stop_ids
        self.live_per_call: list[int] = []  # live slots of each step() call
        self.seconds = 0.0  # time spent inside step()

    def step(self, question: np.ndarray, turn: np.ndarray, live: np.ndarray, action: np.ndarray,
             action_len: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        self.live_per_call.append(int(live.sum()))
        s = len(question)
        obs, obs_len = np.zeros((s, self.obs_len), np.int32), np.zeros(s, np.int32)
        reward, done = np.zeros(s, np.float32), np.zeros(s, bool)
        for i in np.flatnonzero(live):
            state = dataclasses.replace(reference.reset(self.world, int(question[i])), turn=int(turn[i]))
            _, o, reward[i], done[i] = reference.step(self.world, self.cfg, state, action[i, : action_len[i]].tolist())
            obs[i, : len(o)], obs_len[i] = o, len(o)
        self.seconds += time.perf_counter() - t0
        return obs, obs_len, reward, done
