"""The math family's reward: the last box of a response's answer against the reference answer, graded by
math-verify.

What is graded is read as DeepScaleR reads it (`answer_text`): the text after the response's last `</think>`; a
response that opens its thinking and never closes it has no answer; one without thinking is read whole. Training
(the episode's actions decoded together) and `eval --responses` (a line's response) grade through the same
functions. A box is `\\boxed{...}`, `\\fbox{...}` or `\\boxed x` (`last_boxed`).

math-verify (what ToRL and SimpleTIR grade with) bounds its own work with SIGALRM, which only works on a
process's main thread; here its timeouts are off and each comparison runs in a worker process (`workers`) that
is killed and replaced when it runs past `timeout_s`, scoring 0. A response with no box, or whose last box is
not closed, scores 0.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections import OrderedDict
from collections.abc import Sequence
from fractions import Fraction

from trace_jax.envs.math.workers import WorkerPool

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
BOX = re.compile(r"\\(?:boxed|fbox)\s*\{|\\boxed\s+(?=[^\s{$])")  # the openings of a box: braced, or `\boxed x`
BARE = re.compile(r"[^\s$]+")  # the content of `\boxed x`: up to a space or `$`, as math-verify reads it


def answer_text(response: str) -> str | None:
    """The part of a response that holds its answer: after its last `</think>`; None when it opens `<think>` and
    never closes it; the whole response when it does not think."""
    if THINK_CLOSE in response:
        return response.rsplit(THINK_CLOSE, 1)[1]
    return None if THINK_OPEN in response else response


def last_boxed(text: str) -> str | None:
    """The content of the text's last box: `\\boxed{...}` or `\\fbox{...}` (braces balanced), or `\\boxed x` (x up to
    a space or `$`, a final period or comma left out); None if it has none or its last braced box is not closed."""
    openings = list(BOX.finditer(text))
    if not openings:
        return None
    opening, i = openings[-1], openings[-1].end()
    if not opening.group().rstrip().endswith("{"):
        return BARE.match(text, i).group().rstrip(".,")
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def answer_of(response: str) -> str | None:
    """What a response answers: the last box of its `answer_text`, or None."""
    text = answer_text(response)
    return None if text is None else last_boxed(text)


RATIONAL = re.compile(r"^\s*([-+]?)\s*(?:(\d+)\s*(?:/\s*(\d+)\s*)?|\\[dt]?frac\{\s*(\d+)\s*\}\{\s*(\d+)\s*\}\s*)$")


def rational(text: str) -> Fraction | None:
    """The exact value of a plain integer, `a/b` or `\\frac{a}{b}` (`\\dfrac`, `\\tfrac`) with a sign; else None."""
    m = RATIONAL.match(text)
    if m is None:
        return None
    sign, whole, over, top, bottom = m.groups()
    num, den = (int(whole), int(over or 1)) if whole is not None else (int(top), int(bottom))
    return None if den == 0 else Fraction(-num if sign == "-" else num, den)


@functools.lru_cache(maxsize=4096)
def parse_box(boxed: str) -> list:
    from math_verify import parse  # imported where it runs: the verifier's worker processes

    return parse(f"\\boxed{{{boxed}}}", parsing_timeout=None)


def quick_verdict(answer: str, boxed: str | None) -> float | None:
    """The score where no parsing is needed: 0 with no box or an empty one; two exact rationals (integers such as
    AIME's answers, `a/b`, `\\frac{a}{b}`: most of the kit's) compared exactly, as math-verify compares them;
    None otherwise."""
    if boxed is None or not boxed.strip():
        return 0.0
    if (gold := rational(answer)) is not None and (pred := rational(boxed)) is not None:
        return float(gold == pred)
    return None


def _exponents(expr) -> dict | None:
    """expr (a parsed, unevaluated sympy expression) as a finite nonzero constant times symbols to integer powers:
    each symbol's total exponent; None when it is not of that form."""
    if expr.is_Symbol:
        return {expr: 1}
    if expr.is_Pow and expr.exp.is_Integer and (base := _exponents(expr.base)) is not None:
        return {s: k * int(expr.exp) for s, k in base.items()}
    if expr.is_Mul:
        total: dict = {}
        for arg in expr.args:
            if (part := _exponents(arg)) is None:
                return None
            for s, k in part.items():
                total[s] = total.get(s, 0) + k
        return total
    return {} if expr.is_number and expr.is_finite is True and expr.is_nonzero is True else None


def apart(gold: list, pred: list) -> bool:
    """True when math-verify's `verify(gold, pred)` must be False without running it: every parsed gold value is a
    number and every parsed prediction a nonconstant monomial (`\\boxed{Qu}` is q*u), whose difference `simplify`
    cannot bring to 0, and no string of one is a string of the other. What a garbled box costs a policy that
    boxes words: its parse, not a symbolic simplification."""
    from sympy import Expr

    values = lambda xs: [x for x in xs if not isinstance(x, str)]
    strings = lambda xs: {x.strip() for x in xs if isinstance(x, str)}
    if not values(gold) or not values(pred) or strings(gold) & strings(pred):
        return False
    if not all(getattr(g, "is_Number", False) and g.is_finite for g in values(gold)):
        return False
    return all(isinstance(p, Expr) and any((_exponents(p) or {}).values()) for p in values(pred))


def score(answer: str, response: str) -> float:
    """1.0 if what the response answers (`answer_of`) equals `answer` under math-verify, else 0.0 (in this process,
    no timeout)."""
    return score_box(answer, answer_of(response))


def score_box(answer: str, boxed: str | None) -> float:
    """1.0 if a box's content equals `answer` under math-verify, else 0.0 (None: no box)."""
    from math_verify import verify

    quick = quick_verdict(answer, boxed)
    if quick is not None:
        return quick
    gold, pred = parse_box(answer), parse_box(boxed)
    if apart(gold, pred):
        return 0.0
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))


class Verifier:
    """`score` over batches in `workers` processes, each comparison bounded by `timeout_s` (then 0). A score
    depends only on the answer and what the response answers (`answer_of`), so each such pair is compared once
    (`cache_size` kept), and where `quick_verdict` decides, without a worker."""

    def __init__(self, workers: int = 0, timeout_s: float = 10.0, cache_size: int = 65536):
        self.timeout_s, self.cache_size = timeout_s, cache_size
        self.pool = WorkerPool("trace_jax.envs.math.verifier", size=workers)
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()

    def scores(self, answers: Sequence[str], responses: Sequence[str]) -> list[float]:
        if len(answers) != len(responses):
            raise ValueError(f"{len(answers)} answers for {len(responses)} responses")
        keys = [(a, answer_of(r)) for a, r in zip(answers, responses)]
        known = {k: v for k in keys if (v := quick_verdict(*k)) is not None}
        known |= {k: self._cache[k] for k in keys if k in self._cache}
        todo = list(dict.fromkeys(k for k in keys if k not in known))
        requests = [{"answer": a, "boxed": b} for a, b in todo]
        timed_out = {"score": 0.0, "timed_out": True}  # scores 0, and is not kept: a later try may finish
        for key, got in zip(todo, self.pool.ask_many(requests, self.timeout_s, lambda _: timed_out)):
            known[key] = got["score"]
            if "timed_out" not in got:
                self._cache[key] = got["score"]
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return [known[k] for k in keys]

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    """A verifier worker: one {"answer", "boxed"} per line in, one {"score"} per line out."""
    import math_verify  # noqa: F401 - warm before the first request

    for line in sys.stdin:
        request = json.loads(line)
        try:
            got = score_box(request["answer"], request["boxed"])
        except Exception:
            got = 0.0
        sys.stdout.write(json.dumps({"score": got}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
