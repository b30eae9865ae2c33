"""The four multi-turn subsets as loaded from bfcl-eval's data files, and the seeded train/eval split."""

import json

import pytest

from trace_jax.envs.bfcl.data import SUBSETS, function_docs, load_subset, split, write_split

CLASSES = {"GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot", "TravelAPI",
           "VehicleControlAPI"}


def test_subsets(entries):
    assert SUBSETS == ("base", "miss_func", "miss_param", "long_context")
    assert [sum(e.subset == s for e in entries) for s in SUBSETS] == [200] * 4
    assert len({e.id for e in entries}) == 800
    for e in entries:
        assert e.id == f"multi_turn_{e.subset}_{e.number}" and e.long_context == (e.subset == "long_context")
        assert len(e.turns) == len(e.ground_truth) and set(e.involved_classes) <= CLASSES
        offered = {d["name"] for d in e.functions_at(len(e.turns))}
        assert offered == {d["name"] for c in e.involved_classes for d in function_docs(c)}
        assert all(p.count(".") == 1 for p in e.path)  # "Class.method", informative only: some name old methods


def test_missed_functions_held_out_until_their_turn(entries):
    miss = [e for e in entries if e.subset == "miss_func"]
    assert all(e.missed for e in miss) and not any(e.missed for e in entries if e.subset != "miss_func")
    for e in miss:
        for turn, docs in e.missed.items():
            names = {d["name"] for d in docs}
            assert not e.turns[turn] and names.isdisjoint(d["name"] for d in e.functions_at(turn - 1))
            assert names <= {d["name"] for d in e.functions_at(turn)}


def test_unknown_subset():
    with pytest.raises(ValueError, match="unknown BFCL multi-turn subset 'composite'"):
        load_subset("composite")


def test_split_is_seeded_and_keeps_scenarios_apart(entries, tmp_path):
    train, evaluate = split(entries, seed=3)
    assert (train, evaluate) == split(entries, seed=3) and evaluate != split(entries, seed=4)[1]
    assert set(train) | set(evaluate) == {e.id for e in entries} and not set(train) & set(evaluate)
    for subset in SUBSETS:
        assert sum(i.startswith(f"multi_turn_{subset}_") for i in evaluate) == 40
    number = lambda i: int(i.rsplit("_", 1)[1])
    assert not {number(i) for i in train} & {number(i) for i in evaluate}  # variants of a scenario stay together
    saved = json.loads(write_split(tmp_path / "split.json", entries, seed=3).read_text())
    assert saved == {"seed": 3, "train": train, "eval": evaluate}
