"""A host tool whose calls change state (tests/counter_env.py): every slot, forks included, acts on the state its own
history leaves, under every schedule, from snapshots or by replay; hostile calls never raise out of `step`; a
stateless env is called as before."""

import dataclasses

import jax
import numpy as np
import pytest
from counter_env import DEC, ERROR, INC, SUBMIT, VALUE, CounterEnv

from toy import TINY_POLICY
from trace_jax.allocation import Allocator, Plan
from trace_jax.rollout import engine
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.schedule import expand_scheduled
from trace_jax.sharding import init_policy

TARGETS = [0, 1, 2, 3]  # question q asks for the count q
PLAN = Plan(Allocator("uniform_tree", group_size=4), roots=16, continuations=3)  # 64 slots over 4 questions
KW = dict(plan=PLAN, sampling=SamplingConfig(1.0), pad_id=0)


@pytest.fixture(scope="module")
def model():
    # a random policy over the counter's few tokens: a turn's first token is a call 3 times in 10
    return init_policy(dataclasses.replace(TINY_POLICY, vocab_size=CounterEnv(TARGETS).vocab_size), seed=0)


def expand(model, env, **schedule):
    """The tree [S] `env` and the policy roll out for one question each (host env; schedule: chunk_slots or
    live_slots, `expand_scheduled`)."""
    pool = CounterEnv(TARGETS).pool(range(len(TARGETS)))
    tree, _, _, _ = expand_scheduled(model, env, pool, jax.random.key(7), host=True, **schedule, **KW)
    return jax.device_get(tree)


def turns(tree, s: int) -> list[tuple[list[int], list[int]]]:
    """[(action ids, observation ids)] of slot s's turns, decoded from its tokens: each turn's span holds its policy
    tokens, then its observation."""
    out, start = [], int(tree.prompt_len[s])
    for end in tree.boundaries[s, : tree.num_turns[s]]:
        span, mask = tree.tokens[s, start:end].tolist(), tree.policy_mask[s, start:end]
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any(), f"slot {s}: policy tokens must lead their turn"
        out.append((span[:n], span[n:]))
        start = end
    return out


def counter_observations(actions: list[list[int]]) -> list[list[int]]:
    """Plain Python: the observations a counter from 0 answers to `actions` with."""
    count, out = 0, []
    for a in actions:
        if a and a[0] in (INC, DEC, SUBMIT):
            count = max(count + {INC: 1, DEC: -1, SUBMIT: 0}[a[0]], 0)
            out.append([VALUE + count])
        else:
            out.append([ERROR, VALUE + count])
    return out


def check_observations(tree) -> int:
    """Asserts every used slot's observations are the counter of its own episode's actions (a fork's: its copied
    prefix, then its own); returns how many forks' own turns a counter restarted from 0 would answer differently
    (the forks that test the restore)."""
    telling = 0
    for s in np.flatnonzero(tree.used):
        actions, observations = map(list, zip(*turns(tree, s)))
        assert observations == counter_observations(actions), f"slot {s}"
        if tree.is_continuation[s]:
            own = int(tree.branch_turn[s]) + 1  # the first turn the fork played itself
            telling += counter_observations(actions[own:]) != observations[own:]
    return telling


class RecordingCounter(CounterEnv):
    """Records each call: (question, turn, earlier actions, this action) as ids."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def step(self, question, turn, live, action, action_len, past_actions):
        for i in np.flatnonzero(live):
            self.calls.append((int(question[i]), int(turn[i]), tuple(tuple(a.tolist()) for a in past_actions[i]),
                               tuple(action[i, : action_len[i]].tolist())))
        return super().step(question, turn, live, action, action_len, past_actions=past_actions)


def test_every_slot_acts_on_the_state_of_its_own_history(model, monkeypatch):
    env = RecordingCounter(TARGETS)
    tree = expand(model, env)
    assert check_observations(tree) >= 3  # forks mid-episode after counter changes: restoring them is tested
    # the env sees, as past actions, exactly the actions it was given on the earlier turns of that episode
    given = {(q, past, a) for q, _, past, a in env.calls}
    for q, t, past, _ in env.calls:
        assert len(past) == t
        assert not past or (q, past[:-1], past[-1]) in given
    # so every restore after turn 0 found its snapshot: none replayed
    assert env.replays == 0 and env.hits == sum(t > 0 for _, t, _, _ in env.calls) > 0
    # an engine that hands over no history fails the check above (so did one reading each turn one token short,
    # when tried by hand)
    monkeypatch.setattr(engine, "past_actions", lambda tokens, *_: [[] for _ in tokens])
    with pytest.raises(AssertionError):
        check_observations(expand(model, CounterEnv(TARGETS)))


def test_the_same_tree_from_snapshots_or_replay_under_every_schedule(model):
    """Snapshots, replay (cache_size=0) and a cache small enough to evict; the whole tree, chunks of whole prompts
    and refilled rows: the same tokens, episodes and rewards."""
    want = expand(model, CounterEnv(TARGETS))
    assert np.asarray(want.reward).any() and not np.asarray(want.reward)[want.used].all()  # mixed outcomes
    replay, evicting = CounterEnv(TARGETS, cache_size=0), CounterEnv(TARGETS, cache_size=3)
    runs = {"replay": expand(model, replay), "evicting": expand(model, evicting),
            "chunks": expand(model, CounterEnv(TARGETS), chunk_slots=32),
            "refill": expand(model, CounterEnv(TARGETS), live_slots=8),
            "refill, replay": expand(model, CounterEnv(TARGETS, cache_size=0), live_slots=8)}
    assert replay.hits == 0 and replay.replays > 0 and evicting.hits > 0 and evicting.replays > 0
    for name, got in runs.items():
        for field in ("tokens", "policy_mask", "length", "boundaries", "num_turns", "question", "parent",
                      "branch_turn", "done", "reward"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=f"{name}: {field}")
        assert check_observations(got) >= 3, name


BOOM = 9  # Fragile's tool crashes on a call holding this token


class Fragile(CounterEnv):
    """A counter whose tool misbehaves: it crashes (after changing the state) on any call holding BOOM, on SUBMIT
    of an unknown question (targets[q] out of range), and answers a second call of DEC with too long an
    observation."""

    def act(self, state, question, turn, action):
        if BOOM in action.tolist():
            state["count"] += 100
            raise RuntimeError("tool crashed")
        obs, reward, done = super().act(state, question, turn, action)
        return (np.tile(obs, 10) if turn and len(action) and action[0] == DEC else obs), reward, done


def play(env, episodes: list[tuple[int, list[list[int]]]]) -> list[tuple[np.ndarray, ...]]:
    """Every episode (question, actions) through `env.step` turn by turn, all in one batch: each turn's outputs."""
    out = []
    for t in range(max(len(a) for _, a in episodes)):
        live = np.array([t < len(a) for _, a in episodes])
        action = np.zeros((len(episodes), env.action_len), np.int32)
        action_len = np.zeros(len(episodes), np.int32)
        for i, (_, acts) in enumerate(episodes):
            if live[i]:
                action_len[i] = len(acts[t])
                action[i, : len(acts[t])] = acts[t]
        past = [[np.asarray(a, np.int32) for a in acts[:t]] if live[i] else [] for i, (_, acts) in enumerate(episodes)]
        question = np.array([q for q, _ in episodes])
        out.append(env.step(question, np.full(len(episodes), t), live, action, action_len, past_actions=past))
    return out


def test_hostile_calls_never_raise_out_of_step():
    """Crashing calls, garbage tokens, empty actions, unknown questions, long observations: each answered, a crash
    with the error observation, reward 0, the episode going on from the state as it was before the call; the same
    answers from snapshots, replay and an evicting cache."""
    big = np.iinfo(np.int32)
    episodes = [(0, [[INC], [BOOM], [INC], [SUBMIT]]),  # a crash mid-episode: 1, crash, 2 (not 102)
                (1, [[], [INC, BOOM], [BOOM], [INC]]),
                (2, [[big.min, big.max], [-1], [DEC], [DEC]]),
                (99, [[INC], [SUBMIT]]),  # unknown question: its SUBMIT crashes
                (3, [[BOOM], [BOOM], [INC], [DEC]])]
    answers = [play(Fragile(TARGETS, cache_size=n), episodes) for n in (0, 1, 4096)]
    for other in answers[1:]:
        for a, b in zip(answers[0], other):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    obs = [[o[i, : n[i]].tolist() for o, n, _, _ in answers[0][: len(acts)]] for i, (_, acts) in enumerate(episodes)]
    crashed = [ERROR, ERROR]
    assert obs[0] == [[VALUE + 1], crashed, [VALUE + 2], [VALUE + 2]]
    assert obs[1] == [[ERROR, VALUE], crashed, crashed, [VALUE + 1]]
    assert obs[2] == [[ERROR, VALUE], [ERROR, VALUE], [VALUE, VALUE], [VALUE, VALUE]]  # DEC: floored, cut to obs_len
    assert obs[3] == [[VALUE + 1], crashed]
    assert obs[4] == [crashed, crashed, [VALUE + 1], [VALUE, VALUE]]
    reward, done = answers[0][1][2], answers[0][1][3]
    assert reward[3] == 0 and not done[3]  # the crash neither rewards nor ends the episode
    assert answers[0][3][2][0] == 0 and answers[0][3][3][0]  # SUBMIT at 2 for target 0: done, no reward


class TurnCounter:
    """A stateless env with the old `step` (no past_actions): it answers the number of turns taken."""

    max_turns, action_len, obs_len, stop_ids = 4, 3, 2, (INC, DEC, SUBMIT)

    def step(self, question, turn, live, action, action_len):
        s = len(question)
        obs = np.zeros((s, self.obs_len), np.int32)
        obs[:, 0] = VALUE + turn
        return obs, np.ones(s, np.int32), np.zeros(s, np.float32), turn + 1 >= self.max_turns


def test_a_stateless_env_is_called_without_past_actions(model, monkeypatch):
    def unread(*args):
        raise AssertionError("a stateless env's history was read")

    monkeypatch.setattr(engine, "past_actions", unread)
    tree = expand(model, TurnCounter())  # CounterEnv's turn shapes: the same compiled programs
    for s in np.flatnonzero(tree.used):
        assert [o for _, o in turns(tree, s)] == [[VALUE + t] for t in range(tree.num_turns[s])]
