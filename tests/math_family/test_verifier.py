"""The math verifier: math-verify on the response's last box, with a process-level timeout instead of its SIGALRM."""

import threading

import pytest

from trace_jax.envs.math.verifier import Verifier, last_boxed, score

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
