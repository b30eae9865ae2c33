"""The math family's reward: the response's last `\\boxed{}` against the reference answer, graded by math-verify.

math-verify (what ToRL and SimpleTIR grade with) bounds its own work with SIGALRM, which only works on a
process's main thread; here its timeouts are off and each comparison runs in a worker process (`workers`) that
is killed and replaced when it runs past `timeout_s`, scoring 0. A response with no box, or whose last box is
not closed, scores 0.
"""

from __future__ import annotations

import json
import sys
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


def score(answer: str, response: str) -> float:
    """1.0 if the response's last box equals `answer` under math-verify, else 0.0 (in this process, no timeout)."""
    from math_verify import parse, verify  # imported where it runs: the verifier's worker processes

    boxed = last_boxed(response)
    if boxed is None or not boxed.strip():
        return 0.0
    gold = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    pred = parse(f"\\boxed{{{boxed}}}", parsing_timeout=None)
    return float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None))


class Verifier:
    """`score` over batches in `workers` processes, each comparison bounded by `timeout_s` (then 0)."""

    def __init__(self, workers: int = 0, timeout_s: float = 10.0):
        self.timeout_s = timeout_s
        self.pool = WorkerPool("trace_jax.envs.math.verifier", size=workers)

    def scores(self, answers: Sequence[str], responses: Sequence[str]) -> list[float]:
        if len(answers) != len(responses):
            raise ValueError(f"{len(answers)} answers for {len(responses)} responses")
        requests = [{"answer": a, "response": r} for a, r in zip(answers, responses)]
        return [a["score"] for a in self.pool.ask_many(requests, self.timeout_s, lambda _: {"score": 0.0})]

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
