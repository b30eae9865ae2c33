"""The tiny kit's problems: seeded, small, and easier to compute than to guess, with exact answers from sympy.

Four kinds: a power's remainder, counting multiples, a 2x2 linear system, a sum of powers. Each problem comes with
the program a scripted solution runs in the sandbox (`code`); its answer is computed here, apart from that code.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy as sp


@dataclasses.dataclass(frozen=True)
class Problem:
    problem: str
    answer: str  # exact, in LaTeX (an integer, or \frac{p}{q})
    code: str  # a program that prints the answer's value

    def row(self, i: int, split: str) -> dict[str, str]:
        """The DeepScaleR-format row (its `solution` is the tool call)."""
        return {"id": f"{split}-{i}", "problem": self.problem, "answer": self.answer,
                "solution": f"```python\n{self.code}\n```"}


def _power(rng: np.random.Generator) -> Problem:
    a, b, m = int(rng.integers(2, 10)), int(rng.integers(5, 40)), int(rng.integers(3, 20))
    return Problem(f"What is the remainder when {a}^{b} is divided by {m}?", str(sp.Integer(a) ** b % m),
                   f"print(pow({a}, {b}, {m}))")


def _multiples(rng: np.random.Generator) -> Problem:
    n, a = int(rng.integers(30, 200)), int(rng.integers(2, 8))
    b = a + int(rng.integers(1, 5))
    count = n // a + n // b - n // sp.ilcm(a, b)
    return Problem(f"How many integers from 1 to {n} are divisible by {a} or {b}?", str(count),
                   f"print(sum(1 for k in range(1, {n} + 1) if k % {a} == 0 or k % {b} == 0))")


def _system(rng: np.random.Generator) -> Problem:
    while True:
        a, b, c, d = (int(v) for v in rng.integers(1, 8, 4))
        if a * d != b * c:
            break
    e, f = int(rng.integers(1, 30)), int(rng.integers(1, 30))
    x, y = sp.symbols("x y")
    s = sp.solve([a * x + b * y - e, c * x + d * y - f], [x, y])
    return Problem(f"If {a}x + {b}y = {e} and {c}x + {d}y = {f}, what is x + y?", sp.latex(s[x] + s[y]),
                   f"from fractions import Fraction as F\nd = F({a} * {d} - {b} * {c})\n"
                   f"print((F({e} * {d} - {b} * {f}) + F({a} * {f} - {e} * {c})) / d)")  # Cramer's rule


def _sum(rng: np.random.Generator) -> Problem:
    n, p = int(rng.integers(5, 40)), int(rng.integers(1, 4))
    k = sp.symbols("k")
    return Problem(f"What is the sum of k^{p} for k from 1 to {n}?", str(sp.summation(k**p, (k, 1, n))),
                   f"print(sum(k**{p} for k in range(1, {n} + 1)))")


KINDS = (_power, _multiples, _system, _sum)


def generate(n: int, seed: int) -> list[Problem]:
    """n problems, the kinds in turn, each drawn from (seed, its index)."""
    return [KINDS[i % len(KINDS)](np.random.default_rng([seed, i])) for i in range(n)]
