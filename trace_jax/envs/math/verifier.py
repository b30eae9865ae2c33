"""The math family's reward: the response's last `\\boxed{}` against the reference answer, graded by math-verify.

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

from trace_jax.envs.math.workers import WorkerPool


def last_boxed(response: str) -> str | None:
    """The content of the response's last `\\boxed{...}` (braces balanced), or None if it has none or it is not
    closed."""
    start = response.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(response)):
        depth += {"{": 1, "}": -1}.get(response[j], 0)
        if depth == 0:
            return response[i + 1 : j]
    return None


INTEGER = re.compile(r"^\s*[-+]?\d+\s*$")


@functools.lru_cache(maxsize=4096)
def _parse(boxed: str) -> list:
    from math_verify import parse  # imported where it runs: the verifier's worker processes

    return parse(f"\\boxed{{{boxed}}}", parsing_timeout=None)


def quick_verdict(answer: str, boxed: str | None) -> float | None:
    """The score where no parsing is needed: 0 with no box or an empty one; two plain integers (AIME's answers,
    most of the kit's) compared as integers, as math-verify would; None otherwise."""
    if boxed is None or not boxed.strip():
        return 0.0
    if INTEGER.match(answer) and INTEGER.match(boxed):
        return float(int(answer) == int(boxed))
    return None


def score(answer: str, response: str) -> float:
    """1.0 if the response's last box equals `answer` under math-verify, else 0.0 (in this process, no timeout)."""
    from math_verify import verify

    boxed = last_boxed(response)
    quick = quick_verdict(answer, boxed)
    if quick is not None:
        return quick
    gold, pred = _parse(answer), _parse(boxed)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))


class Verifier:
    """`score` over batches in `workers` processes, each comparison bounded by `timeout_s` (then 0). A score depends
    only on the answer and the response's last box, so each such pair is compared once (`cache_size` kept), and
    where `quick_verdict` decides, without a worker."""

    def __init__(self, workers: int = 0, timeout_s: float = 10.0, cache_size: int = 65536):
        self.timeout_s, self.cache_size = timeout_s, cache_size
        self.pool = WorkerPool("trace_jax.envs.math.verifier", size=workers)
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()

    def scores(self, answers: Sequence[str], responses: Sequence[str]) -> list[float]:
        if len(answers) != len(responses):
            raise ValueError(f"{len(answers)} answers for {len(responses)} responses")
        keys = [(a, last_boxed(r)) for a, r in zip(answers, responses)]
        known = {k: v for k in keys if (v := quick_verdict(*k)) is not None}
        known |= {k: self._cache[k] for k in keys if k in self._cache}
        todo = list(dict.fromkeys(k for k in keys if k not in known))
        requests = [{"answer": a, "response": f"\\boxed{{{b}}}"} for a, b in todo]
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
    """A verifier worker: one {"answer", "response"} per line in, one {"score"} per line out."""
    import math_verify  # noqa: F401 - warm before the first request

    for line in sys.stdin:
        request = json.loads(line)
        try:
            got = score(request["answer"], request["response"])
        except Exception:
            got = 0.0
        sys.stdout.write(json.dumps({"score": got}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
