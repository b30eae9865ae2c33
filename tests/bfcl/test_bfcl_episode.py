"""The episode logic against bfcl-eval's own scoring: ground-truth replays pass, replays missing a call score what
bfcl's multi_turn_checker says, the step limit and held-out functions behave as bfcl's inference loop has them."""

import numpy as np
import pytest
from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC, MAXIMUM_STEP_LIMIT
from bfcl_replay import DONE, bfcl_valid, messages, plan, public_state, run

from trace_jax.envs.bfcl.apis import Apis
from trace_jax.envs.bfcl.calls import call_string, tool_call_text
from trace_jax.envs.bfcl.episode import Episode, reference


@pytest.mark.parametrize("per_step", [False, True], ids=["turn-per-message", "call-per-message"])
def test_ground_truth_replay_scores_one(entries, per_step):
    """Every entry of every subset (800): its ground truth, one message per turn or one per call, scores 1, and the
    episode records exactly those calls (bfcl's decoded model result)."""
    for entry in entries:
        steps = plan(entry, per_step)
        episode, reward = run(entry, messages(entry, steps))
        assert reward == 1.0, (entry.id, episode.failure)
        binder = Apis.of(entry)
        assert episode.calls == [[[call_string(binder.bind(c)) for c in s] for s in turn] for turn in steps], entry.id


def test_edited_replays_score_as_bfcl(entries):
    """The ground truth with one call (seeded) left out, on half the entries, or made twice, on the other half: the
    reward is bfcl's multi_turn_checker's verdict on the same calls, for all 800 entries (a dropped call fails all
    but a few, a repeated one passes most: both verdicts occur)."""
    rng = np.random.default_rng(0)
    rewards = []
    for i, entry in enumerate(entries):
        if not any(entry.ground_truth):
            continue
        edit, steps = ("drop", "repeat")[i % 2], plan(entry, per_step=i // 2 % 2 == 1)
        where = [(t, s, c) for t, turn in enumerate(steps) for s, step in enumerate(turn) for c in range(len(step))]
        t, s, c = where[rng.integers(len(where))]
        if edit == "drop":
            del steps[t][s][c]
        else:
            steps[t][s].insert(c, steps[t][s][c])
        _, reward = run(entry, messages(entry, steps))
        assert reward == float(bfcl_valid(entry, steps)), (entry.id, edit, t, s, c)
        rewards.append(reward)
    assert 0 < sum(rewards) < len(rewards)


def test_full_ground_truth_valid_for_bfcl(entries):
    """bfcl's checker passes the ground truth of a sample (the comparison above is against a working checker)."""
    for entry in entries[::25]:
        assert bfcl_valid(entry, plan(entry)), entry.id


def _filesystem_entry(entries):
    return next(e for e in entries if e.subset == "base" and e.involved_classes == ("GorillaFileSystem",)
                and e.ground_truth[0])


def test_step_limit_is_bfcls(entries):
    """MAXIMUM_STEP_LIMIT messages of calls in one user turn run; bfcl force-quits after one more: reward 0."""
    entry = _filesystem_entry(entries)
    ref, episode = reference(entry), Episode.start(entry)
    pwd = tool_call_text([Apis.of(entry).bind("pwd()")])
    for _ in range(MAXIMUM_STEP_LIMIT):
        assert not episode.step(pwd, entry, ref).done
    reply = episode.step(pwd, entry, ref)
    assert (reply.done, reply.reward, reply.messages) == (True, 0.0, [])
    assert "steps" in episode.failure


def test_empty_turn_fails(entries):
    entry = _filesystem_entry(entries)
    episode, reward = run(entry, [DONE])
    assert reward == 0.0 and episode.failure == "Model response list is empty for turn 0"


def test_held_out_function_until_its_turn(entries):
    """A miss_func entry: the held-out function is left out of the tools until its turn, whose user message lists
    it; called before it, it runs, as bfcl's inference loop runs it (multi_turn_miss_func_49's ground truth calls
    `tail` two turns before bfcl reveals it)."""
    entry = next(e for e in entries if e.subset == "miss_func" and "GorillaFileSystem" in e.involved_classes
                 and any(d["name"] == "touch" for docs in e.missed.values() for d in docs))
    (turn, docs), = entry.missed.items()
    touch = tool_call_text([Apis.of(entry).bind("touch(file_name='held_out.txt')")])
    ref, episode = reference(entry), Episode.start(entry)
    assert "touch" not in str(entry.functions_at(0)) and "touch" in str(entry.functions_at(turn))
    reply = episode.step(touch, entry, ref)
    assert reply.messages[0]["content"] == "None" and "held_out.txt" in str(public_state(episode.apis.instances))
    steps = plan(entry)
    texts = messages(entry, steps[:turn])  # the turns before the reveal, as the ground truth answers them
    episode, _ = run(entry, texts[:-1], ref)
    reveal = episode.step(texts[-1], entry, ref).messages
    assert len(reveal) == 1 and reveal[0]["role"] == "user"
    assert DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC in reveal[0]["content"]
    assert all(f'"name": "{d["name"]}"' in reveal[0]["content"] for d in docs)
    result = episode.step(touch, entry, ref).messages[0]["content"]
    assert result == "None" and "held_out.txt" in str(public_state(episode.apis.instances))
