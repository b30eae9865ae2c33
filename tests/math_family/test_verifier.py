"""The math verifier: math-verify on the last box of the response's answer (after its thinking, as DeepScaleR reads
it), with a process-level timeout instead of its SIGALRM."""

import random
import threading
from fractions import Fraction

import pytest

from trace_jax.envs.math.verifier import Verifier, answer_of, apart, last_boxed, parse_box, quick_verdict, score

MATCH = [  # (reference answer, response): must score 1
    ("\\frac{1}{2}", "so the probability is \\boxed{\\frac{1}{2}}"),
    ("\\frac{1}{2}", "\\boxed{0.5}"),
    ("0.5", "\\boxed{\\frac12}"),
    ("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}"),
    ("1.25", "\\boxed{5/4}"),
    ("42", "First \\boxed{41}, no wait: the answer is \\boxed{42}"),  # the last box counts
    ("\\sqrt{2}", "\\boxed{2^{1/2}}"),
    ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}"),
    ("x^2 + 1", "\\boxed{1 + x^2}"),
    ("[1, 2)", "\\boxed{[1,2)}"),
    ("(-\\infty, 3]", "\\boxed{(-\\infty,3]}"),
    ("\\{1, 2, 3\\}", "\\boxed{\\{3, 2, 1\\}}"),
    ("10", "\\boxed{10\\text{ cm}}"),  # units dropped
    ("90", "\\boxed{90^\\circ}"),
    ("-7", "\\boxed{-7}"),
    ("1000", "\\boxed{1,000}"),
    ("\\pi", "\\boxed{\\pi}"),
    # the answer after the thinking (DeepScaleR's `split("</think>")[-1]`), the thinking's own boxes aside
    ("5", "<think>maybe \\boxed{4}</think> So \\boxed{5}."),
    ("5", "<think>a</think> \\boxed{3} <think>b \\boxed{9}</think> \\boxed{5}"),  # after the last </think>
    ("5", "\\boxed{5}"),  # no thinking: read whole
    # the boxes DeepScaleR's extraction reads (Hendrycks' `last_boxed_only_string`)
    ("5", "\\boxed 5"),
    ("12", "the answer is $\\boxed 12$."),
    ("5", "so \\boxed 5."),
    ("5", "\\fbox{5}"),
    ("\\frac{1}{2}", "\\fbox{\\frac{1}{2}}"),
    ("5", "\\boxed {5}"),
]
NO_MATCH = [  # must score 0
    ("42", "\\boxed{41}"),  # a wrong answer inside a box
    ("42", "The answer is 42."),  # no box at all
    ("42", "\\boxed{42"),  # a box never closed
    ("42", "\\boxed{}"),  # an empty box
    ("42", "\\boxed{42} then \\boxed{43}"),  # the last box is wrong
    ("\\frac{1}{2}", "\\boxed{0.51}"),
    ("[1, 2)", "\\boxed{(1, 2)}"),  # an interval's ends matter
    ("\\{1, 2\\}", "\\boxed{\\{1, 2, 3\\}}"),
    ("x^2 + 1", "\\boxed{x^2 - 1}"),
    ("3", "\\boxed{3.001}"),
    ("3", "\\boxed{\\frac{}{}}"),  # malformed LaTeX
    ("3", ""),
    ("5", "<think>it is \\boxed{5}</think> The answer is 7."),  # a box inside the thinking is not the answer
    ("7", "<think>it is \\boxed{5}</think> The answer is 7."),  # and an answer outside a box is none
    ("5", "<think>it is \\boxed{5}"),  # thinking opened, never closed: no answer
    ("5", "\\boxed{5} <think>then"),
    ("5", "\\boxed{5}</think> \\boxed{6}"),
    ("5", "\\boxedx"),
]


@pytest.fixture(scope="module")
def verifier():
    with Verifier(workers=2) as v:
        yield v


def test_the_table_of_answers_that_must_and_must_not_match(verifier):
    answers, responses = zip(*MATCH, *NO_MATCH)
    got = verifier.scores(answers, responses)
    assert got == [1.0] * len(MATCH) + [0.0] * len(NO_MATCH), [
        (a, r, s) for a, r, s in zip(answers, responses, got)]


def test_last_boxed_reads_nested_braces():
    assert last_boxed("\\boxed{1} and \\boxed{\\frac{a}{b+1}} end") == "\\frac{a}{b+1}"
    assert last_boxed("\\boxed{\\frac{a}{b}") is None and last_boxed("no box") is None


@pytest.mark.parametrize("response, answer", [
    ("\\boxed{1} then \\boxed 2", "2"), ("\\boxed 2 then \\fbox{3}", "3"),  # the last box of any form
    ("$\\boxed -3$.", "-3"), ("\\boxed 7, so", "7"), ("\\boxed{1} \\boxed", "1"),  # a bare \\boxed opens none
    ("<think>\\boxed{1}</think>", None), ("<think></think>\\boxed{1}</think>", None), ("<think>\\boxed{1}", None),
])
def test_what_a_response_answers(response, answer):
    assert answer_of(response) == answer


def test_a_comparison_past_the_timeout_scores_0_and_the_verifier_goes_on():
    with Verifier(workers=1, timeout_s=1e-4) as hasty:  # no answer can come back this soon
        assert hasty.scores(["\\frac{1}{2}"], ["\\boxed{0.5}"]) == [0.0]
        assert hasty.pool.restarts == 1
        hasty.timeout_s = 30.0  # the timed-out comparison was not kept: it runs again, and finishes
        assert hasty.scores(["\\frac{1}{2}"], ["\\boxed{0.5}"]) == [1.0]


def test_score_runs_off_the_main_thread():
    """math-verify's SIGALRM timeouts raise off the main thread; with them off, a thread may grade."""
    got = []
    thread = threading.Thread(target=lambda: got.append(score("\\frac{1}{2}", "\\boxed{0.5}")))
    thread.start()
    thread.join()
    assert got == [1.0]


def _forms(value: Fraction, rng: random.Random) -> str:
    """value written as an integer, a/b or \\frac{a}{b} (\\dfrac, \\tfrac), unreduced at times, spaced at times."""
    k = rng.choice([1, 1, 2, 3])
    num, den = value.numerator * k, value.denominator * k
    sign, num = ("-" if num < 0 else rng.choice(["", "+"])), abs(num)
    sp = rng.choice(["", " "])
    if den == 1 and rng.random() < 0.5:
        return f"{sign}{sp}{num}"
    if rng.random() < 0.5:
        return f"{sign}{num}{sp}/{sp}{den}"
    return f"{sign}\\{rng.choice(['', 'd', 't'])}frac{{{num}}}{{{den}}}"


def test_the_shortcut_for_exact_rationals_agrees_with_math_verify():
    """Random pairs of integers and fractions in the forms the shortcut reads, equal, off in the seventh decimal
    (where a rounding comparison would say equal), negated, inverted or far apart: the shortcut decides each, and
    math-verify itself gives the same verdict."""
    from math_verify import parse, verify

    rng = random.Random(0)
    for _ in range(150):
        gold = Fraction(rng.randint(-500, 500), rng.choice([1, 1, 2, 3, 7, 9, 1000]))
        near, far = gold + Fraction(1, 10**7), gold + rng.randint(1, 9)
        pred = rng.choice([gold, near, far, -gold, 1 / gold if gold else far])
        answer, boxed = _forms(gold, rng), _forms(pred, rng)
        reference = float(verify(parse(f"\\boxed{{{answer}}}", parsing_timeout=None),
                                 parse(f"\\boxed{{{boxed}}}", parsing_timeout=None), timeout_seconds=None))
        assert quick_verdict(answer, boxed) == reference, (answer, boxed)
    assert quick_verdict("1/3", "1/3.0") is None and quick_verdict("3", "1/0") is None  # left to math-verify


APART = [("12", b) for b in ("Qu", "think", " Sandbox", "ne/4", "ii", "pi", "\\pi x", "x y z^{-1}", "2i", "t")] + [
    ("\\frac{1}{2}", "x/2"), ("-3", "k^{2}")]  # garbled boxes against numbers: a monomial that is not constant
NOT_APART = [  # left to math-verify: equal to the number after all, or not a monomial, or not against a number
    ("12", "\\sin^2 x + \\cos^2 x + 11"), ("12", "12 x x^{-1}"), ("0", "0 x"), ("1", "x^0"), ("12", "\\infty x"),
    ("12", "(x+1)^2-x^2-2x"), ("12", "e"), ("12", "x=3"), ("2x", "x 2"), ("x", "x"), ("\\{1,2\\}", "ab")]


@pytest.mark.parametrize("answer,boxed", APART + NOT_APART)
def test_apart_skips_math_verify_only_where_it_must_say_no(answer, boxed):
    from math_verify import verify

    gold, pred = parse_box(answer), parse_box(boxed)
    assert apart(gold, pred) == ((answer, boxed) in APART)
    if apart(gold, pred):
        assert not verify(gold, pred, timeout_seconds=None)
