"""The math environment: code blocks run in the sandbox with their episode's earlier cells, forks resume from the
interpreter state at their anchor (from snapshots and by replay), answers are graded, garbage never raises."""

import dataclasses

import numpy as np
import pytest

from trace_jax.data.search_qa_tiny import train_tokenizer
from trace_jax.envs.math.config import MathConfig
from trace_jax.envs.math.env import MathEnv
from trace_jax.envs.math.sandbox import SandboxConfig, SandboxPool
from trace_jax.envs.math.verifier import Verifier

CFG = MathConfig(max_tool_calls=3, action_len=64, obs_len=64, sandbox=SandboxConfig(workers=2, cpu_s=1, wall_s=2))


@pytest.fixture(scope="module")
def tools():
    tokenizer = train_tokenizer(["```python\nx = 5\nprint(x * 10)\n```\n```output\n50\n```\n \\boxed{7}"])
    with SandboxPool(CFG.sandbox) as sandbox, Verifier(workers=1) as verifier:
        yield tokenizer, sandbox, verifier


def make_env(tools, cache_size=4096):
    tokenizer, sandbox, verifier = tools
    return MathEnv(tokenizer, ["7", "12"], CFG, sandbox, verifier, cache_size=cache_size)


def ids(env, text):
    return np.asarray(env.tokenizer.encode(text, add_special_tokens=False), np.int32)


def turn(env, slots):
    """slots: (question, earlier action texts, this action text) per slot -> (observation texts, reward, done)."""
    acts = [ids(env, a) for _, _, a in slots]
    action = np.zeros((len(slots), max(map(len, acts))), np.int32)
    for i, a in enumerate(acts):
        action[i, : len(a)] = a
    obs, obs_len, reward, done = env.step(
        np.array([q for q, _, _ in slots]), np.array([len(p) for _, p, _ in slots]), np.ones(len(slots), bool),
        action, np.array(list(map(len, acts))), past_actions=[[ids(env, t) for t in p] for _, p, _ in slots])
    texts = [env.tokenizer.decode(o[:n].tolist()) for o, n in zip(obs, obs_len)]
    return texts, reward.tolist(), done.tolist()


def code(src):
    return f"Compute.\n```python\n{src}\n```\n"


def test_the_parent_and_its_forks_print_what_the_anchor_printed(tools):
    """An anchor's cell draws from `random` and reads the clock; the parent's next turn and two forks of the anchor
    (served by both workers) print the values the anchor printed."""
    env = make_env(tools)
    env.obs_len, env._room = 512, 480  # room for the whole line
    anchor = code("import random, time\nx, t = random.random(), time.time()\nprint(x, t)")
    (printed,), _, _ = turn(env, [(0, [], anchor)])
    texts, _, _ = turn(env, [(0, [anchor], code("print(x, t)"))] * 3)
    assert texts == [printed] * 3 and env.diverged == 0


def test_the_cache_holds_a_recipes_step():
    """Every history a step stores stays in the cache to the step's end: the math recipes' stage 1 (M = 1024
    roots, 5 turns) and their continuations (N = 2 per root)."""
    from trace_jax.envs.math.env import cache_size

    assert cache_size(1024 * (1 + 2), 5) >= 1024 * 3 * 5 and cache_size(4, 2) == 4096


@pytest.mark.parametrize("cache_size", [4096, 0], ids=["snapshots", "replay"])
def test_a_fork_sees_the_interpreter_state_at_its_anchor(tools, cache_size):
    env = make_env(tools, cache_size)
    first = code("x = 5")
    assert turn(env, [(0, [], first)])[0] == ["```output\n(no output)\n```\n"]
    # the parent's turn 1 changes x; a continuation forked after turn 0 runs in the same batch and after it
    parent, fork = code("x = x * 10\nprint(x)"), code("print(x)")
    assert turn(env, [(0, [first], parent), (0, [first], fork)])[0] == ["```output\n50\n```\n",
                                                                        "```output\n5\n```\n"]
    assert turn(env, [(0, [first], fork)])[0] == ["```output\n5\n```\n"]  # not the parent's 50
    assert turn(env, [(0, [first, parent], fork)])[0] == ["```output\n50\n```\n"]
    assert (env.hits > 0, env.replays > 0) == ((True, False) if cache_size else (False, True))


def test_a_cell_stopped_by_a_limit_is_not_replayed(tools):
    env = make_env(tools)
    loop = code("y = 1\nwhile True: pass")
    assert "Timeout" in turn(env, [(0, [], loop)])[0][0]
    texts, _, _ = turn(env, [(0, [loop], code("print('y' in dir())"))])
    assert texts == ["```output\nFalse\n```\n"]  # answered at once: the loop was left out


def test_answers_are_graded_and_the_turn_after_the_last_tool_call_must_answer(tools):
    env = make_env(tools)
    assert turn(env, [(0, [], "so \\boxed{7}"), (1, [], "so \\boxed{7}"), (0, [], "no box, no code")])[1:] == (
        [1.0, 0.0, 0.0], [True, True, True])
    # the episode is graded, as evaluation logs it (its actions decoded together) and `eval --responses` reads it:
    # a box the answering turn lacks is read from an earlier turn, and one inside a turn's thinking is not
    assert turn(env, [(0, ["I guess \\boxed{7} " + code("x = 1")], "done")])[1] == [1.0]
    assert turn(env, [(0, ["<think>\\boxed{7}</think>" + code("x = 1")], "done")])[1] == [0.0]
    assert turn(env, [(0, ["<think>\\boxed{1}</think>" + code("x = 1")], "<think>so</think> \\boxed 7")])[1] == [1.0]
    calls = [code("x = 1"), code("x = 2"), code("x = 3")]  # max_tool_calls=3 used: this block is the answer
    texts, reward, done = turn(env, [(0, calls, code("print(7)") + "\\boxed{7}")])
    assert (texts, reward, done) == ([""], [1.0], [True])


def test_garbage_actions_never_raise(tools):
    env = make_env(tools)
    rng = np.random.default_rng(0)
    s = 6
    action = rng.integers(0, len(env.tokenizer), (s, CFG.action_len)).astype(np.int32)
    fence = ids(env, "```python\n")
    action[1, : len(fence)] = fence  # a block never closed
    lengths = np.array([CFG.action_len, len(fence), 0, 10, CFG.action_len, 1])
    past = [[rng.integers(0, len(env.tokenizer), 9).astype(np.int32)] for _ in range(s)]
    obs, obs_len, reward, done = env.step(np.zeros(s, np.int64), np.ones(s, np.int64), np.ones(s, bool), action,
                                          lengths, past_actions=past)
    assert obs.shape == (s, CFG.obs_len) and (obs_len <= CFG.obs_len).all() and (reward == 0).all()


def test_an_environment_that_fails_inside_gives_each_slot_an_error(tools):
    env = make_env(tools)
    env.verifier = None  # any answering slot now raises inside `step`
    texts, reward, done = turn(env, [(0, [], "\\boxed{7}"), (0, [], code("print(1)"))])
    assert texts == ["```output\nSandbox error: AttributeError\n```\n"] * 2 and reward == [0.0, 0.0]


def test_a_config_that_leaves_no_room_for_output_is_refused(tools):
    tokenizer, sandbox, verifier = tools
    with pytest.raises(ValueError, match="task.obs_len=4 leaves no room"):
        MathEnv(tokenizer, ["1"], dataclasses.replace(CFG, obs_len=4), sandbox, verifier)
