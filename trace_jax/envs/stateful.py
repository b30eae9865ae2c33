"""A base for host tools whose calls change state (a key-value store, a file system, an interpreter).

The engine hands `step` every slot's earlier actions (`HostEnv`, stateful); this class turns that history into the
episode's state. A history names its state: after each turn the state is snapshotted under (question, actions so
far), so a continuation forked after turn t finds the state its parent left there, in O(1) for copyable state.
Where the snapshot is gone (evicted, a resumed run, another process) the state is rebuilt by replaying the history
on a fresh state; replay is also what an uncopyable state (a worker process's interpreter) uses, by returning
None from `snapshot` or setting cache_size=0. Replay needs `act` to be deterministic.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import numpy as np

History = tuple  # (question, bytes of each action so far): the key of the state those actions leave


class StatefulHostEnv:
    """Subclasses set max_turns, action_len, obs_len, stop_ids (stop_sequences) and implement `fresh`, `act` and
    `error_observation`. Counters: `hits` (states restored from a snapshot), `replays` (states rebuilt)."""

    stateful = True
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __init__(self, cache_size: int = 4096):
        self.cache_size = cache_size  # snapshots kept (least recently used dropped first); 0: always replay
        self._snapshots: OrderedDict[History, Any] = OrderedDict()
        self.hits = self.replays = 0

    def fresh(self, question: int) -> Any:
        """The state an episode of `question` starts from."""
        raise NotImplementedError

    def act(self, state: Any, question: int, turn: int, action: np.ndarray) -> tuple[np.ndarray, float, bool]:
        """One call: action [a] token ids -> (observation token ids, reward, done); may change `state` in place."""
        raise NotImplementedError

    def error_observation(self, exc: Exception) -> np.ndarray:
        """The observation token ids of a call that raised `exc`."""
        raise NotImplementedError

    def snapshot(self, state: Any) -> Any | None:
        """An independent copy of `state` (None: it cannot be copied, so it is replayed instead)."""
        return copy.deepcopy(state)

    def step(self, question: np.ndarray, turn: np.ndarray, live: np.ndarray, action: np.ndarray,
             action_len: np.ndarray, past_actions: list[list[np.ndarray]]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`HostEnv.step` (stateful): question, turn, live [S], action [S, A], action_len [S], past_actions (per
        slot, its earlier turns' action ids) -> (obs [S, O], obs_len [S], reward [S], done [S]). Never raises."""
        s = len(question)
        obs, obs_len = np.zeros((s, self.obs_len), np.int32), np.zeros(s, np.int32)
        reward, done = np.zeros(s, np.float32), np.zeros(s, bool)
        for i in np.flatnonzero(live):
            q, past = int(question[i]), [np.asarray(a, np.int32) for a in past_actions[i]]
            act = np.asarray(action[i, : action_len[i]], np.int32)
            o, reward[i], done[i] = self._call(q, int(turn[i]), past, act)
            o = o[: self.obs_len]
            obs[i, : len(o)], obs_len[i] = o, len(o)
        return obs, obs_len, reward, done

    def _call(self, question: int, turn: int, past: list[np.ndarray], action: np.ndarray
              ) -> tuple[np.ndarray, float, bool]:
        """One slot's turn: restore the state of (question, past), act, snapshot the state it leaves."""
        history: History = (question, *(a.tobytes() for a in past))
        after = (*history, action.tobytes())
        try:
            state = self._restore(history, past)
            obs, reward, done = self.act(state, question, turn, action)
            out = np.asarray(obs, np.int32).reshape(-1), float(reward), bool(done)
        except Exception as exc:  # the state stays as before the call: keep that one for `after`
            if history in self._snapshots:
                self._keep(after, self._snapshots[history])
            return np.asarray(self.error_observation(exc), np.int32).reshape(-1), 0.0, False
        self._keep(after, self.snapshot(state))
        return out

    def _restore(self, history: History, past: list[np.ndarray]) -> Any:
        """The state `history` leaves, for acting on: a copy of its snapshot, else replayed."""
        question = history[0]
        snap = self._snapshots.get(history)  # states are never None: None is a miss
        if snap is not None:
            copied = self.snapshot(snap)
            if copied is not None:
                self._snapshots.move_to_end(history)
                self.hits += 1
                return copied
        if not past:
            return self.fresh(question)
        self.replays += 1
        state, applied = self.fresh(question), []
        for turn, action in enumerate(past):
            try:
                self.act(state, question, turn, action)
                applied.append((turn, action))
            except Exception:  # that call left the state as before it: rebuild from the calls that did not raise
                state = self.fresh(question)
                for t, a in applied:
                    self.act(state, question, t, a)
        return state

    def _keep(self, history: History, snap: Any | None) -> None:
        if snap is None or self.cache_size <= 0:
            return
        self._snapshots[history] = snap
        self._snapshots.move_to_end(history)
        while len(self._snapshots) > self.cache_size:
            self._snapshots.popitem(last=False)
