"""Answer scoring as Search-R1 does it: normalisation, exact match (the reward), sub-EM and F1.

`normalize_answer` lowercases, strips punctuation and the articles a/an/the, and collapses
whitespace (Search-R1's `qa_em.normalize_answer`, itself SQuAD's). F1 is SQuAD's token F1 on
the normalised strings, maximised over gold answers, so an exact match always has F1 = 1.
"""

from __future__ import annotations

import collections
import re
import string

_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(prediction: str, golds: list[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(g) == pred for g in golds))


def sub_exact_match(prediction: str, golds: list[str]) -> float:
    """1.0 when a normalised gold answer is a substring of the normalised prediction. A gold that normalises to
    nothing ("The") matches only a prediction that does too, as in EM: every string contains the empty one, so
    Search-R1 counts it a match for any prediction."""
    pred = normalize_answer(prediction)
    return float(any(gold in pred if gold else not pred for gold in map(normalize_answer, golds)))


def f1(prediction: str, golds: list[str]) -> float:
    """Token F1 between the normalised prediction and the best gold answer."""
    pred = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        ref = normalize_answer(gold).split()
        if not pred or not ref:  # SQuAD's rule: both empty is a match, one empty is not
            best = max(best, float(pred == ref))
            continue
        common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
        if common:
            p, r = common / len(pred), common / len(ref)
            best = max(best, 2 * p * r / (p + r))
    return best


def score(answer: str | None, golds: list[str]) -> dict[str, float]:
    """em (the reward), sub_em and f1 of an episode's answer, the content of its final turn's `<answer>` as the
    environment reads it (`protocol.parse_action`); all 0 when it gave none."""
    if answer is None:
        return {"em": 0.0, "sub_em": 0.0, "f1": 0.0}
    return {"em": exact_match(answer, golds), "sub_em": sub_exact_match(answer, golds), "f1": f1(answer, golds)}
