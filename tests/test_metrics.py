"""MetricsLogger (JSONL + TensorBoard), read_metrics, plot_metrics, compare_runs."""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from trace_jax.metrics import MetricsLogger, compare_runs, plot_metrics, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def scalars(out_dir) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per tag, as TensorBoard reads the run's event files."""
    acc = EventAccumulator(str(out_dir / "tensorboard"), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def write_run(out_dir, steps=range(6), scale=1.0):
    with MetricsLogger(out_dir) as logger:
        for step in steps:
            metrics = {"loss": scale / (step + 1), "reward": scale * step}
            if step % 3 == 0:
                metrics["eval/success_hop2"] = 0.1 * step
            logger.log(step, metrics)


def is_png(path) -> bool:
    return path.is_file() and path.stat().st_size > 0 and path.read_bytes()[:8] == PNG_MAGIC


def test_jsonl_round_trip(tmp_path):
    logger = MetricsLogger(tmp_path)
    logger.log(0, {"loss": 1.5, "count": np.int64(3), "ratio": np.float32(0.25),
                   "eval/success_hop2": jnp.float32(0.5), "bf16": jnp.array(2.0, jnp.bfloat16), "ok": True})
    logger.log(1, {"loss": float("nan"), "grad_norm": np.float32("inf"), "ratio": jnp.float32(-np.inf)})
    # flushed on every log: readable before close
    assert read_metrics(tmp_path) == [
        {"step": 0, "loss": 1.5, "count": 3, "ratio": 0.25, "eval/success_hop2": 0.5, "bf16": 2.0, "ok": 1},
        {"step": 1, "loss": None, "grad_norm": None, "ratio": None},
    ]
    logger.close()
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[1]) == {"step": 1, "loss": None, "grad_norm": None, "ratio": None}
    assert "NaN" not in lines[1] and "Infinity" not in lines[1]


def test_log_rejects_bad_values(tmp_path):
    with MetricsLogger(tmp_path) as logger:
        with pytest.raises(ValueError, match="'vec'"):
            logger.log(0, {"vec": np.zeros(3)})
        with pytest.raises(ValueError, match="reserved"):
            logger.log(0, {"step": 1})


def test_read_metrics_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_metrics(tmp_path / "nope")


def test_resume_truncates_later_steps(tmp_path):
    write_run(tmp_path, steps=range(6))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')  # a line cut short by a crash
    with MetricsLogger(tmp_path, resume_from_step=3) as logger:
        assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]
        logger.log(4, {"loss": 42.0})
        logger.log(5, {"loss": 43.0})
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert [r["loss"] for r in records[4:]] == [42.0, 43.0]
    # TensorBoard hides the first session's events after the resume step, even in the same second
    tb = scalars(tmp_path)
    assert tb["loss"] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3)), (3, 0.25), (4, 42.0), (5, 43.0)]
    assert tb["reward"] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]


def test_append_without_resume(tmp_path):
    write_run(tmp_path, steps=range(2))
    write_run(tmp_path, steps=range(2, 4))
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3]


def test_tensorboard_tags_and_values(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in range(4):
        logger.log(step, {"train/loss": np.float32(1.0 / (step + 1)),
                          "eval/success_hop2": jnp.float32(0.25 * step), "nan": float("nan")})
    tb = scalars(tmp_path)  # readable before close
    logger.close()
    assert set(tb) == {"train/loss", "eval/success_hop2", "nan"}
    assert tb["train/loss"] == [(s, pytest.approx(1.0 / (s + 1))) for s in range(4)]
    assert tb["eval/success_hop2"] == [(s, 0.25 * s) for s in range(4)]
    assert all(math.isnan(v) for _, v in tb["nan"])


def test_plot_metrics(tmp_path):
    write_run(tmp_path)
    with MetricsLogger(tmp_path) as logger:
        logger.log(6, {"loss": float("nan")})
    assert plot_metrics(tmp_path) == tmp_path / "metrics.png"
    assert is_png(tmp_path / "metrics.png")
    many = {f"k{i}": float(i) for i in range(13)}
    with MetricsLogger(tmp_path / "wide") as logger:
        logger.log(0, many)
        logger.log(1, many)
    assert is_png(plot_metrics(tmp_path / "wide"))
    out = plot_metrics(tmp_path, keys=["eval/success_hop2"], path=tmp_path / "sub" / "eval.png")
    assert out == tmp_path / "sub" / "eval.png" and is_png(out)
    with pytest.raises(ValueError, match="'accuracy'"):
        plot_metrics(tmp_path, keys=["loss", "accuracy"])
    with pytest.raises(FileNotFoundError, match="missing"):
        plot_metrics(tmp_path / "missing")


def test_compare_runs(tmp_path):
    write_run(tmp_path / "trace", scale=2.0)
    write_run(tmp_path / "grpo", steps=range(4))
    with MetricsLogger(tmp_path / "trace") as logger:
        logger.log(6, {"effective_ratio": 0.8})  # a key only one run has
    runs = {"trace": tmp_path / "trace", "grpo": tmp_path / "grpo"}
    out = compare_runs(runs, ["reward", "effective_ratio", "eval/success_hop2"], tmp_path / "cmp.png")
    assert out == tmp_path / "cmp.png" and is_png(out)
    with pytest.raises(ValueError, match="'nope'"):
        compare_runs(runs, ["reward", "nope"], tmp_path / "bad.png")
    with pytest.raises(FileNotFoundError, match="ppo"):
        compare_runs({**runs, "ppo": tmp_path / "ppo"}, ["reward"], tmp_path / "bad.png")
