"""SearchQAEnv on hand-written turns: one batched retriever call per turn, observations as token ids,
the exact-match reward, corrective observations, the turn limit, and garbage that never crashes it."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_jax.envs.search_qa.config import SearchQAConfig
from trace_jax.envs.search_qa.env import INFO_CLOSE, INFO_OPEN, SearchQAEnv, prompt_ids
from trace_jax.envs.search_qa.protocol import INVALID_OBSERVATION, search_observation

CFG = SearchQAConfig(max_turns=3, action_len=40, obs_len=200)


class Recorder:
    """A retriever that records its calls and returns fixed passages per query."""

    def __init__(self):
        self.calls = []

    def __call__(self, queries):
        self.calls.append(list(queries))
        return [[{"document": {"id": str(i), "contents": f'"T{i}"\npassage about {q}'}, "score": 1.0}
                 for i in range(3)] for q in queries]


def actions(tokenizer, texts, width=CFG.action_len):
    ids = [tokenizer.encode(t, add_special_tokens=False)[:width] for t in texts]
    out = np.zeros((len(ids), width), np.int32)
    for i, row in enumerate(ids):
        out[i, : len(row)] = row
    return out, np.array([len(r) for r in ids], np.int32)


def test_one_turn_of_every_kind(tokenizer):
    retriever = Recorder()
    env = SearchQAEnv(tokenizer, [["Paris"], ["Lyon", "Lugdunum"], ["x"], ["y"], ["z"]], retriever, CFG)
    texts = ["<think>hm</think><search> capital of France </search>", "<answer> the lugdunum </answer>",
             "no tags at all", "<answer>Lyon</answer>", "<search>q2</search>"]
    act, n = actions(tokenizer, texts)
    question = np.array([0, 1, 2, 3, 4])
    live = np.array([True, True, True, True, False])
    obs, obs_len, reward, done = env.step(question, np.array([0, 0, 0, 2, 0]), live, act, n)
    assert retriever.calls == [["capital of France"]]  # one call, live searching slots only
    first = tokenizer.decode(obs[0, : obs_len[0]])
    docs = [h["document"] for h in retriever(["capital of France"])[0]]
    assert first == search_observation(docs)  # the passages, formatted as Search-R1 does, as ids
    assert reward.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0] and done.tolist() == [False, True, False, True, False]
    assert tokenizer.decode(obs[2, : obs_len[2]]) == INVALID_OBSERVATION
    assert obs_len[1] == obs_len[3] == obs_len[4] == 0  # answered / last turn / not live: no observation


def test_passages_are_cut_to_the_observation_budget(tokenizer):
    long = lambda qs: [[{"document": {"contents": '"T"\n' + "word " * 500}}] for _ in qs]
    env = SearchQAEnv(tokenizer, [["a"]], long, CFG)
    act, n = actions(tokenizer, ["<search>q</search>"])
    obs, obs_len, _, _ = env.step(np.array([0]), np.array([0]), np.array([True]), act, n)
    assert obs_len[0] == CFG.obs_len
    text = tokenizer.decode(obs[0, : obs_len[0]])
    assert text.startswith(INFO_OPEN + "Doc 1(Title:") and text.endswith(INFO_CLOSE)  # the tags survive the cut
    with pytest.raises(ValueError, match="obs_len=4 leaves no room for passages"):
        SearchQAEnv(tokenizer, [["a"]], long, SearchQAConfig(obs_len=4))


def test_stop_sequences_are_the_tags_as_the_tokenizer_writes_them(tokenizer):
    env = SearchQAEnv(tokenizer, [["a"]], Recorder(), CFG)
    for text in ("<search> q </search>", "<answer> a</answer>"):
        ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        assert any(ids[-len(s):] == s for s in env.stop_sequences)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in env.stop_ids


def test_prompt_is_the_chat_template_of_search_r1_instruction(tokenizer):
    ids = prompt_ids(tokenizer, "  where was Ada born? ")
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nAnswer the given question.") and text.endswith("<|im_start|>assistant\n")
    assert "Question: where was Ada born?\n<|im_end|>" in text


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 599), min_size=0, max_size=CFG.action_len), st.integers(0, CFG.max_turns - 1))
def test_garbage_tokens_never_crash_it(tokenizer, ids, turn):
    env = SearchQAEnv(tokenizer, [["a"]], Recorder(), CFG)
    act = np.zeros((1, CFG.action_len), np.int32)
    act[0, : len(ids)] = ids
    obs, obs_len, reward, done = env.step(np.array([0]), np.array([turn]), np.array([True]), act,
                                          np.array([len(ids)]))
    assert 0 <= obs_len[0] <= CFG.obs_len and reward[0] in (0.0, 1.0)
    assert done[0] or obs_len[0] > 0  # an unfinished episode always gets an observation
    json.dumps(tokenizer.decode(obs[0, : obs_len[0]]))
