"""Search QA evaluation scores an episode's final turn as the environment rewarded it."""

import dataclasses

import numpy as np
import pytest

from trace_jax.envs.search_qa.protocol import parse_action
from trace_jax.evaluate_qa import final_turns, responses
from trace_jax.rollout.tree import Tree


class Chars:
    """A tokenizer of one character per id."""

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["".join(map(chr, row)) for row in ids]


def episode(prompt: str, turns: list[tuple[str, str]], length: int) -> dict:
    """One slot's arrays: the prompt, then each (action, observation) turn."""
    tokens, policy, bounds = list(map(ord, prompt)), [False] * len(prompt), []
    for action, obs in turns:
        tokens += map(ord, action + obs)
        policy += [True] * len(action) + [False] * len(obs)
        bounds.append(len(tokens))
    pad = length - len(tokens)
    return {"tokens": tokens + [0] * pad, "policy_mask": policy + [False] * pad, "prompt_len": len(prompt),
            "boundaries": bounds + [Tree.NO_TURN] * (3 - len(bounds)), "num_turns": len(turns)}


def test_final_turn_is_the_rewarded_action():
    # turn 1 cut off at the action length (invalid, so observed), turn 2 closing the tag: the environment saw two
    # invalid turns (reward 0), though the joined response holds "<answer> Paris </answer>"
    slots = [episode("Q?", [("<answer> Par", "[invalid]"), ("is </answer>", "")], 64),
             episode("Q?", [("<answer> Par", "[invalid]"), ("<answer>Lyon</answer>", "")], 64),
             episode("Q?", [("<search>x</search>", "<information>d</information>")], 64),
             episode("Q?", [], 64)]
    arrays = {k: np.asarray([s[k] for s in slots]) for k in slots[0]}
    tree = dataclasses.replace(Tree.empty(4, 64, 3, 0), **arrays)
    assert responses(tree, Chars())[0] == "<answer> Paris </answer>"
    finals = final_turns(tree, Chars())
    assert finals == ["is </answer>", "<answer>Lyon</answer>", "<search>x</search>", ""]
    assert [parse_action(f).kind for f in finals] == ["invalid", "answer", "search", "invalid"]


def test_an_evaluation_set_with_no_question_that_fits_is_refused(tokenizer, monkeypatch):
    """Its EM would read 0 and pull the average over datasets down."""
    from trace_jax.data import search_qa_prompts
    from trace_jax.envs.search_qa.config import SearchQAConfig

    rows = {"train": [{"question": "Who?", "golden_answers": ["a"]}],
            "test": [{"question": "who " * 300, "golden_answers": ["b"]}]}
    monkeypatch.setattr(search_qa_prompts, "build_qa", lambda *args: None)
    monkeypatch.setattr(search_qa_prompts, "read_qa", lambda data_dir, dataset, split: rows[split])
    load = lambda datasets: search_qa_prompts.load_questions(SearchQAConfig(eval_datasets=datasets), "unused",
                                                             tokenizer, 0)
    with pytest.raises(ValueError, match="no nq evaluation question fits search_qa.prompt_len=256"):
        load(("nq",))
    rows["test"].append({"question": "Where?", "golden_answers": ["c"]})
    assert len(load(("nq",)).evals["nq"].ids) == 1


def test_several_training_datasets_make_one_set_each_question_with_its_own_answers(tokenizer, monkeypatch):
    """search_qa.train_datasets with two datasets: their train splits in order, each prompt and gold its own
    question's; each evaluation dataset on its test split, or dev where it has none."""
    from trace_jax.data import search_qa_prompts
    from trace_jax.envs.search_qa.config import SearchQAConfig

    rows = {("nq", "train"): [{"question": "Who wrote Ulysses?", "golden_answers": ["Joyce"]},
                              {"question": "Where is Lyon?", "golden_answers": ["France"]}],
            ("hotpotqa", "train"): [{"question": "When was Ada born?", "golden_answers": ["1815"]}],
            ("nq", "test"): [{"question": "Who?", "golden_answers": ["Bob"]}],
            ("hotpotqa", "dev"): [{"question": "When?", "golden_answers": ["1901", "MCMI"]}]}

    def read_qa(data_dir, dataset, split):
        if (dataset, split) not in rows:
            raise ValueError(f"no {split} split")
        return rows[dataset, split]

    monkeypatch.setattr(search_qa_prompts, "build_qa", lambda *args: None)
    monkeypatch.setattr(search_qa_prompts, "read_qa", read_qa)
    both = ("nq", "hotpotqa")
    q = search_qa_prompts.load_questions(SearchQAConfig(train_datasets=both, eval_datasets=both), "unused",
                                         tokenizer, 0)
    train = rows["nq", "train"] + rows["hotpotqa", "train"]
    assert [q.golds[i] for i in q.train.ids] == [r["golden_answers"] for r in train]
    prompts = tokenizer.batch_decode([t[:n] for t, n in zip(q.train.tokens, q.train.lengths)])
    assert all(r["question"] in p for r, p in zip(train, prompts, strict=True))
    evals = {d: [q.golds[i] for i in s.ids] for d, s in q.evals.items()}
    assert evals == {"nq": [["Bob"]], "hotpotqa": [["1901", "MCMI"]]}
