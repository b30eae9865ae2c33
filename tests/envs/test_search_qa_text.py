"""Search-R1's answer scoring and turn parsing, including malformed, truncated and adversarial text."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_jax.envs.search_qa.answers import exact_match, f1, normalize_answer, score, sub_exact_match
from trace_jax.envs.search_qa.protocol import (
    INVALID_OBSERVATION,
    Action,
    format_passages,
    parse_action,
    search_observation,
)


@pytest.mark.parametrize("text, normalised", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  an   Apple,  a day! ", "apple day"),
    ("Jean-Paul Sartre", "jeanpaul sartre"),  # punctuation is deleted, not replaced by a space
    ("Theatre of the Absurd", "theatre of absurd"),  # articles are whole words only
    ("A", ""),
    ("U.S.A.", "usa"),
])
def test_normalisation_matches_search_r1(text, normalised):
    assert normalize_answer(text) == normalised


def test_em_sub_em_f1():
    golds = ["Barack Obama", "Obama"]
    assert exact_match("barack obama.", golds) == 1.0 and exact_match("President Obama", golds) == 0.0
    assert sub_exact_match("President Barack Obama", golds) == 1.0
    assert f1("President Obama", ["Barack Obama"]) == pytest.approx(0.5)
    assert f1("", ["x"]) == 0.0 and f1("the", ["a"]) == 1.0  # SQuAD: both empty after normalising


def test_score():
    assert score(None, ["Paris"]) == {"em": 0.0, "sub_em": 0.0, "f1": 0.0}  # no answer given
    assert score("the paris", ["Paris"]) == {"em": 1.0, "sub_em": 1.0, "f1": 1.0}
    # a gold answer that normalises to nothing sub-matches only an answer that does too (every string contains "")
    assert score("Berlin", ["The", "Paris"])["sub_em"] == 0.0 and score("Berlin", ["The", "Berlin"])["sub_em"] == 1.0
    assert score("the", ["The"]) == {"em": 1.0, "sub_em": 1.0, "f1": 1.0}


@pytest.mark.parametrize("turn, action", [
    ("<think>find it</think>\n<search> capital of France </search>", Action("search", "capital of France")),
    ("<answer>Paris</answer><search>q</search>", Action("answer", "Paris")),  # the first pair decides
    ("<search><answer>x</answer></search>", Action("search", "<answer>x</answer>")),  # nesting: as Search-R1
    ("<search>multi\nline</search>", Action("search", "multi\nline")),
    ("<search>truncated mid-que", Action("invalid", "")),
    ("<search>mismatched</answer>", Action("invalid", "")),
    ("", Action("invalid", "")),
    ("<answer></answer>", Action("answer", "")),
])
def test_parse_action(turn, action):
    assert parse_action(turn) == action


PIECES = list("ab <>/\n\x00é") + ["<search>", "</search>", "<answer>", "</answer>", "<think>", "the", "."]
TAGGY = st.lists(st.sampled_from(PIECES), max_size=30).map("".join)  # text dense in tags, half-tags and junk


@given(TAGGY)
def test_parsing_and_scoring_never_raise(text):
    action = parse_action(text)
    assert action.kind in ("search", "answer", "invalid")
    assert action.kind != "invalid" or action.content == ""
    s = score(action.content if action.kind == "answer" else None, ["a b", ""])
    assert all(0.0 <= v <= 1.0 for v in s.values())
    assert s["em"] <= s["sub_em"] and (s["em"] == 0.0 or s["f1"] == 1.0)


@given(st.text(max_size=40))
def test_normalisation_is_idempotent(text):
    assert normalize_answer(normalize_answer(text)) == normalize_answer(text)


def test_observations():
    docs = [{"id": "1", "contents": '"Paris"\nParis is the capital.\nSecond line.'},
            {"id": "2", "contents": "NoTitle"}]
    assert format_passages(docs) == ('Doc 1(Title: "Paris") Paris is the capital.\nSecond line.\n'
                                     "Doc 2(Title: NoTitle) \n")
    assert search_observation(docs).startswith("\n\n<information>Doc 1(Title:")
    assert search_observation(docs).endswith("Doc 2(Title: NoTitle)</information>\n\n")
    assert "<search> and </search>" in INVALID_OBSERVATION
