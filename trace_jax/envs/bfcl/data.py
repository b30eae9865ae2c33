"""The four BFCL v4 multi-turn subsets, read from the installed bfcl-eval package's data files.

An entry is a conversation of user turns over the APIs of its involved classes, each loaded from its initial
configuration. The subsets are variants of the same 200 scenarios (entry i of each shares its APIs and, mostly, its
questions): `split` therefore splits by the entry's number, with one seeded permutation for all subsets, so that no
scenario is in both the training and the evaluation side.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from bfcl_eval.constants.category_mapping import MULTI_TURN_CATEGORY, VERSION_PREFIX
from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

SUBSETS = tuple(c.removeprefix("multi_turn_") for c in MULTI_TURN_CATEGORY)  # base, miss_func, miss_param, long_context
SCENARIOS = 200  # entries per subset, numbered 0..199


@dataclasses.dataclass(frozen=True, eq=False)
class Entry:
    """One multi-turn test entry with its ground truth. Turn t's user messages are `turns[t]` (empty at a turn that
    reveals held-out functions); `ground_truth[t]` the call strings that answer it (empty: nothing can be done)."""

    id: str  # "multi_turn_<subset>_<n>"
    subset: str
    turns: tuple[tuple[dict[str, str], ...], ...]
    functions: tuple[dict[str, Any], ...]  # BFCL function docs offered from the start
    missed: dict[int, tuple[dict[str, Any], ...]]  # turn -> docs held out until that turn (miss_func)
    initial_config: dict[str, Any]  # class name -> its scenario (`_load_scenario`)
    involved_classes: tuple[str, ...]
    path: tuple[str, ...]  # "Class.method" the ground truth calls (as bfcl has it: some name renamed methods)
    long_context: bool  # the classes load their long-context scenario variant
    ground_truth: tuple[tuple[str, ...], ...]

    @property
    def number(self) -> int:
        return int(self.id.rsplit("_", 1)[1])

    def functions_at(self, turn: int) -> tuple[dict[str, Any], ...]:
        """The docs offered at user turn `turn`: the initial ones, then each held-out batch from its turn on."""
        return self.functions + tuple(d for t, docs in sorted(self.missed.items()) if t <= turn for d in docs)


def _package_data() -> Path:
    return Path(str(resources.files("bfcl_eval") / "data"))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def function_docs(class_name: str) -> list[dict[str, Any]]:
    """The BFCL function docs of one API class (bfcl_eval/data/multi_turn_func_doc)."""
    return _lines(_package_data() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])


def load_subset(subset: str) -> list[Entry]:
    """The entries of one subset (base, miss_func, miss_param, long_context) in the package's order."""
    if subset not in SUBSETS:
        raise ValueError(f"unknown BFCL multi-turn subset {subset!r}; use one of {SUBSETS}")
    data = _package_data()
    name = f"{VERSION_PREFIX}_multi_turn_{subset}.json"
    answers = {row["id"]: row["ground_truth"] for row in _lines(data / "possible_answer" / name)}
    rows = _lines(data / name)
    docs_of = {c: function_docs(c) for c in {c for row in rows for c in row["involved_classes"]}}
    entries = []
    for row in rows:
        docs = [d for c in row["involved_classes"] for d in docs_of[c]]
        missed_names = {int(t): set(names) for t, names in row.get("missed_function", {}).items()}
        held = {n for names in missed_names.values() for n in names}
        entries.append(Entry(
            id=row["id"], subset=subset, turns=tuple(tuple(turn) for turn in row["question"]),
            functions=tuple(d for d in docs if d["name"] not in held),
            missed={t: tuple(d for d in docs if d["name"] in names) for t, names in missed_names.items()},
            initial_config=row["initial_config"], involved_classes=tuple(row["involved_classes"]),
            path=tuple(row["path"]), long_context=subset == "long_context",
            ground_truth=tuple(tuple(calls) for calls in answers[row["id"]])))
    return entries


def load_entries(subsets: tuple[str, ...] = SUBSETS) -> list[Entry]:
    """Every entry of `subsets`, subset by subset."""
    return [e for s in subsets for e in load_subset(s)]


def split(entries: list[Entry], seed: int, eval_fraction: float = 0.2) -> tuple[list[str], list[str]]:
    """(train ids, eval ids): entries whose scenario number falls in the eval share of a seeded permutation of the
    numbers go to eval (per subset 160/40 for 0.2), the same numbers in every subset."""
    if any(e.number >= SCENARIOS for e in entries):
        raise ValueError(f"an entry is numbered past {SCENARIOS - 1}: this bfcl-eval has more scenarios; raise "
                         f"SCENARIOS in {__name__}")
    order = np.random.default_rng(seed).permutation(SCENARIOS)
    held = set(order[: round(SCENARIOS * eval_fraction)].tolist())
    train = [e.id for e in entries if e.number not in held]
    return train, [e.id for e in entries if e.number in held]


def write_split(path: str | Path, entries: list[Entry], seed: int, eval_fraction: float = 0.2) -> Path:
    """`split` as JSON {"seed", "train": [ids], "eval": [ids]} at path."""
    train, evaluate = split(entries, seed, eval_fraction)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seed": seed, "train": train, "eval": evaluate}, indent=1) + "\n")
    return out
