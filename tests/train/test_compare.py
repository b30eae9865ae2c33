"""The comparison table's numbers come straight from each run's metrics log."""

import pytest

from trace_jax.metrics import MetricsLogger, read_metrics
from trace_jax.train.compare import summarize


def test_summary_means_and_first_last_eval(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log(0, {"eval/success": 0.4})
        log.log(1, {"reward": 0.5, "effective_ratio": 0.2, "generated_tokens": 100, "leaves": 48})
        log.log(2, {"reward": 0.7, "effective_ratio": 0.6, "generated_tokens": 300, "leaves": 48,
                    "eval/success": 0.55})
    s = summarize(read_metrics(tmp_path))
    assert s["reward"] == pytest.approx(0.6) and s["effective_ratio"] == pytest.approx(0.4)
    assert s["generated_tokens"] == pytest.approx(200) and s["leaves"] == 48
    assert (s["eval_start"], s["eval_end"]) == (0.4, 0.55)
