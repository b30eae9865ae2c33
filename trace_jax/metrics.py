"""Training metrics: a JSONL + TensorBoard logger, and PNG plots of one or several runs.

A run directory holds `metrics.jsonl` (one `{"step": k, ...}` object a line; NaN and inf are
written as null) and `tensorboard/` (scalar event files, one per logger session).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure


@contextlib.contextmanager
def _without_torch() -> Iterator[None]:
    """Imports inside see PyTorch as not installed (`import torch` raises ImportError) unless it is loaded already.
    tensorboardX imports it at import time, where installed (Colab, the test suite), only to accept torch tensors,
    which nothing here logs: ~2.5 s of the start of every process that logs. PyTorch stays importable afterwards."""
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None  # the import system's "not installed" marker
    try:
        yield
    finally:
        del sys.modules["torch"]


with _without_torch():
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    from tensorboardX.proto.summary_pb2 import Summary
    from tensorboardX.summary import histogram

__all__ = ["METRICS_FILE", "TENSORBOARD_DIR", "MetricsLogger", "compare_runs", "plot_metrics", "plot_reliability",
           "read_metrics", "rewind_jsonl"]

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_MAX_COLS = 4


def _scalar(key: str, value: Any) -> int | float:
    """A Python int (integer/bool dtypes) or float from a Python, numpy or JAX scalar."""
    a = np.asarray(value)
    if a.ndim == 0 and (jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == bool):
        return int(a)
    if a.ndim == 0 and jnp.issubdtype(a.dtype, jnp.floating):  # includes bfloat16
        return float(a)
    raise ValueError(f"metric {key!r} must be a real scalar, got {type(value).__name__} "
                     f"{a.dtype}{list(a.shape)}")


def _read_lines(path: Path) -> list[str]:
    """The complete lines of `path`; a final line without newline (a write cut by a crash) is dropped."""
    lines = path.read_text().split("\n")
    return [line for line in lines[:-1] if line.strip()]


class MetricsLogger:
    """Appends each `log(step, metrics)` to `out_dir/metrics.jsonl` and `out_dir/tensorboard/`.

    Both files are flushed (and the event file fsynced) on every `log`, so killing the process
    loses nothing already logged. Keys become TensorBoard tags as is ('eval/success_hop2').
    `append(name, record)` adds a line to another JSONL file of the run.

    Without `resume_from_step` an existing `metrics.jsonl` is appended to. With
    `resume_from_step=k` its lines with step > k are dropped first, so a run resumed from the
    checkpoint at step k does not repeat steps logged after it before a crash. TensorBoard events
    go to a new event file that starts with a restart marker at step k + 1: TensorBoard then hides
    the older files' events at steps > k (and in any case shows the latest value per step).

    With `active=False` (the processes of a multi-host run other than 0) it writes nothing at all.
    `on_log(step, metrics)`, when given, sees each row it writes, as floats (NaN where the file has null; e.g. a
    notebook's live plots).
    """

    def __init__(self, out_dir: str | Path, resume_from_step: int | None = None, active: bool = True,
                 on_log: Callable[[int, dict[str, int | float]], None] | None = None):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / METRICS_FILE
        self.active = active
        self.on_log = on_log
        if not active:
            return
        tb_dir = self.out_dir / TENSORBOARD_DIR
        tb_dir.mkdir(parents=True, exist_ok=True)
        rewind_jsonl(self.path, resume_from_step)
        self._file = self.path.open("a")
        # The event file name holds the second it was opened; the counter keeps files opened in
        # the same second apart and in order (TensorBoard reads a directory's files sorted by name).
        n_files = sum(1 for p in tb_dir.iterdir() if "tfevents" in p.name)
        self._events = EventsWriter(str(tb_dir / "events"), filename_suffix=f".{n_files:04d}")
        if resume_from_step is not None:
            self._events.write_event(Event(wall_time=time.time(), step=resume_from_step + 1,
                                           session_log=SessionLog(status=SessionLog.START)))
        self._events.flush()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Writes `metrics` (scalars; NaN/inf become null in the JSONL) at `step`."""
        if "step" in metrics:
            raise ValueError("'step' is reserved; pass it as the step argument")
        values = {key: _scalar(key, value) for key, value in metrics.items()}
        if not self.active:
            return
        record = {"step": int(step)} | {k: v if math.isfinite(v) else None for k, v in values.items()}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self._events.write_event(Event(wall_time=time.time(), step=int(step), summary=summary))
        self._events.flush()
        if self.on_log:
            self.on_log(int(step), values)

    def histogram(self, step: int, tag: str, values: Any, bins: int = 20) -> None:
        """Writes a TensorBoard histogram of `values` (any shape) at `step` (TensorBoard only, not the JSONL)."""
        if not self.active:
            return
        self._events.write_event(Event(wall_time=time.time(), step=int(step),
                                       summary=histogram(tag, np.asarray(values, np.float64).ravel(), bins)))
        self._events.flush()

    def append(self, name: str, record: Mapping[str, Any]) -> None:
        """Appends `record` as one JSON line to `out_dir/name`."""
        if self.active:
            with (self.out_dir / name).open("a") as f:
                f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Closes both files; idempotent."""
        if self.active and not self._file.closed:
            self._file.close()
            self._events.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def rewind_jsonl(path: Path, step: int | None) -> None:
    """Drops a cut final line of the JSONL file `path` (if it exists) and, unless step is None, its records
    with "step" > step: a run resumed from step `step` then rewrites what it logged after it."""
    if not path.exists():
        return
    lines = _read_lines(path)
    if step is not None:
        lines = [line for line in lines if json.loads(line)["step"] <= step]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


def read_metrics(out_dir: str | Path) -> list[dict]:
    """The records of `out_dir/metrics.jsonl`, in file order (null values as None)."""
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    return [json.loads(line) for line in _read_lines(path)]


def _numeric_keys(records: Sequence[dict]) -> list[str]:
    """Keys other than 'step' holding at least one number, in order of first appearance."""
    keys: dict[str, None] = {}
    for record in records:
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                keys[key] = None
    return list(keys)


def _check_keys(keys: Sequence[str], known: set[str], where: str) -> None:
    unknown = [key for key in keys if key not in known]
    if unknown:
        raise ValueError(f"unknown metric keys {unknown} in {where}; known: {sorted(known)}")
    if not keys:
        raise ValueError(f"no metric keys to plot in {where}")


def _panels(keys: Sequence[str]) -> tuple[Figure, dict]:
    """A figure with one titled panel per key, at most `_MAX_COLS` a row, 4 x 3 inches each. Its margins are fixed in
    inches: a layout engine measures every label and took half the time of saving a 19-panel run plot."""
    ncols = min(len(keys), _MAX_COLS)
    nrows = -(-len(keys) // ncols)
    width, height = 4 * ncols, 3 * nrows
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.15 / width, bottom=0.55 / height, top=1 - 0.3 / height,
                        wspace=0.25, hspace=0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(keys):]:
        ax.set_axis_off()
    for ax, key in zip(axes, keys):
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    return fig, dict(zip(keys, axes))


def _draw(ax, records: Sequence[dict], key: str, label: str | None = None) -> None:
    """Plots `key` against step; series logged at under half the steps (evals) get markers."""
    points = [(r["step"], np.nan if r[key] is None else r[key]) for r in records if key in r]
    if not points:
        return
    steps, values = zip(*points)
    sparse = len(points) <= max(1, len({r["step"] for r in records}) // 2)
    ax.plot(steps, values, label=label, **({"marker": "o", "markersize": 4} if sparse else {}))


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)  # a bare Figure renders with Agg; no display needed
    return path


def plot_metrics(out_dir: str | Path, keys: Sequence[str] | None = None,
                 path: str | Path | None = None) -> Path:
    """Saves one panel per key (default: every numeric key) of a run to `path` (default
    `out_dir/metrics.png`) and returns that path."""
    records = read_metrics(out_dir)
    keys = _numeric_keys(records) if keys is None else list(keys)
    _check_keys(keys, {k for r in records for k in r} - {"step"}, str(Path(out_dir) / METRICS_FILE))
    fig, axes = _panels(keys)
    for key, ax in axes.items():
        _draw(ax, records, key)
    return _save(fig, Path(out_dir) / "metrics.png" if path is None else Path(path))


def compare_runs(run_dirs: Mapping[str, str | Path], keys: Sequence[str], path: str | Path) -> Path:
    """Overlays several runs (legend label = mapping key) on one panel per key, saved to `path`.

    A key need only be present in some of the runs (e.g. a metric one allocator lacks)."""
    if not run_dirs:
        raise ValueError("no runs to compare")
    runs = {label: read_metrics(run_dir) for label, run_dir in run_dirs.items()}
    keys = list(keys)
    _check_keys(keys, {k for records in runs.values() for r in records for k in r} - {"step"},
                ", ".join(str(d) for d in run_dirs.values()))
    fig, axes = _panels(keys)
    for key, ax in axes.items():
        for label, records in runs.items():
            _draw(ax, records, key, label)
        if ax.lines:
            ax.legend(fontsize=8)
    return _save(fig, Path(path))


def plot_reliability(panels: Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]], path: str | Path) -> Path:
    """Reliability diagrams: one panel per title, one curve per label, from reliability bins
    {"count": [bins], "pred": [bins], "target": [bins]} (`objectives.reliability_bins`); empty bins are skipped.
    A calibrated predictor lies on the diagonal; marker area shows how many nodes a bin holds."""
    titles = list(panels)
    fig = Figure(figsize=(4 * len(titles), 4), layout="constrained")
    for ax, title in zip(fig.subplots(1, len(titles), squeeze=False).ravel(), titles):
        ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--")
        for label, b in panels[title].items():
            count = np.asarray(b["count"], float)
            keep = count > 0
            line, = ax.plot(np.asarray(b["pred"])[keep], np.asarray(b["target"])[keep], label=label)
            ax.scatter(np.asarray(b["pred"])[keep], np.asarray(b["target"])[keep], color=line.get_color(),
                       s=10 + 200 * count[keep] / max(count.sum(), 1e-12))
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted success V~", ylabel="observed success", title=title)
        ax.grid(alpha=0.3)
        if len(panels[title]) > 1:
            ax.legend(fontsize=8)
    return _save(fig, Path(path))
