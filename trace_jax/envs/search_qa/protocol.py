"""The Search-R1 turn protocol as text: parse a policy turn into an action, format observations.

A turn is free text that should contain `<search> query </search>` or `<answer> text </answer>`;
the first such pair decides the action (Search-R1's `postprocess_predictions`). Anything else is
invalid and gets the corrective observation. Observations are the retrieved passages as
`Doc i(Title: title) text` lines inside `<information>`.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
STOP_STRINGS = ("</search>", "</answer>")  # a turn's generation stops after either

INVALID_OBSERVATION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)


class Action(NamedTuple):
    kind: Literal["search", "answer", "invalid"]
    content: str  # the query or the answer, stripped; "" when invalid


def parse_action(turn: str) -> Action:
    """The action of one policy turn. Never raises, whatever the text."""
    match = _ACTION.search(turn)
    if match is None:
        return Action("invalid", "")
    return Action(match.group(1), match.group(2).strip())  # type: ignore[arg-type]


def format_passages(docs: list[dict]) -> str:
    """`Doc i(Title: ...) text` per retrieved document; `contents` is `"title"\\ntext` (wiki-18 format)."""
    lines = []
    for i, doc in enumerate(docs):
        title, _, text = str(doc.get("contents", "")).partition("\n")
        lines.append(f"Doc {i + 1}(Title: {title}) {text}\n")
    return "".join(lines)


def search_observation(docs: list[dict]) -> str:
    return f"\n\n<information>{format_passages(docs).strip()}</information>\n\n"
