"""The comparison's figures, from the runs' raw files (metrics, reliability and allocation JSONL)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from trace_jax.compare.summary import SUCCESS, run_curves
from trace_jax.metrics import plot_reliability, read_metrics
from trace_jax.train.loop import ALLOCATION_FILE, RELIABILITY_FILE


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _band(ax, x: np.ndarray, ys: np.ndarray, label: str) -> None:
    """Mean over rows of ys [seeds, x] as a line, ± sample std as a band when there are several seeds."""
    mean = ys.mean(0)
    line, = ax.plot(x, mean, label=label)
    if len(ys) > 1:
        std = ys.std(0, ddof=1)
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path


def plot_comparison(out_dir: str | Path, methods: Sequence[str], seeds: Sequence[int], summary: dict) -> list[Path]:
    """Writes success_vs_tokens.png, effective_ratio.png, reliability.png (where the runs log V~'s reliability)
    and budget.png into out_dir; test success is the summary's success_metric."""
    metric = summary.get("success_metric", SUCCESS)
    out = Path(out_dir)
    runs = {m: {s: out / "runs" / m / f"seed{s}" for s in seeds} for m in methods}
    metrics = {m: {s: read_metrics(d) for s, d in r.items()} for m, r in runs.items()}
    band = "± sample std over seeds" if len(seeds) > 1 else "one seed"

    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.subplots()
    grid = np.linspace(0.0, summary["tokens_at"], 50)
    for m in methods:
        curves = [run_curves(rows, metric) for rows in metrics[m].values()]
        _band(ax, grid, np.stack([np.interp(grid, c["eval_tokens"], c["eval_success"]) for c in curves]), m)
        for c in curves:
            ax.scatter(c["eval_tokens"], c["eval_success"], s=8, color=ax.lines[-1].get_color(), alpha=0.5)
    ax.set(xlabel="cumulative generated policy tokens", ylabel=f"test success ({metric})", xlim=(0, None),
           title=f"test success at equal cost\n(band: {band}; dots: evaluations)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths = [_save(fig, out / "success_vs_tokens.png")]

    fig = Figure(figsize=(11, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    for key, ax in zip(("effective_ratio", "generated_tokens"), axes):
        for m in methods:
            rows = [[r[key] for r in sorted(rs, key=lambda r: r["step"]) if r["step"] > 0]
                    for rs in metrics[m].values()]
            n = min(map(len, rows))
            _band(ax, np.arange(1, n + 1), np.array([r[:n] for r in rows], float), m)
        ax.set(xlabel="step", title=f"{key} per step ({band})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    paths.append(_save(fig, out / "effective_ratio.png"))

    if all((d / RELIABILITY_FILE).exists() for r in runs.values() for d in r.values()):  # V~ reliability logged
        panels: dict[str, dict] = {"root V~ (test, last evaluation)": {}, "prefix V~ (test, last evaluation)": {}}
        for m in methods:
            last = [_jsonl(d / RELIABILITY_FILE)[-1] for d in runs[m].values()]
            for name, title in zip(("root", "prefix"), panels):
                count = np.sum([b[name]["count"] for b in last], 0)
                w = np.maximum(count, 1e-12)
                panels[title][m] = {"count": count, "pred": np.sum([np.multiply(b[name]["pred"], b[name]["count"])
                                                                     for b in last], 0) / w,
                                    "target": np.sum([np.multiply(b[name]["target"], b[name]["count"])
                                                      for b in last], 0) / w}
        paths.append(plot_reliability(panels, out / "reliability.png"))

    fig = Figure(figsize=(11, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    titles = {"roots_per_prompt": "stage 1: root rollouts per pool prompt (0: filtered out)",
              "continuations_per_anchor": "stage 2: continuations per valid anchor"}
    for (key, title), ax in zip(titles.items(), axes):
        hists = {}
        for m in methods:
            counts = [np.asarray(row[key], float) for d in runs[m].values() for row in _jsonl(d / ALLOCATION_FILE)]
            total = np.zeros(max(map(len, counts)))
            for c in counts:
                total[: len(c)] += c
            if total[1:].any():  # prefix-free methods place no continuations: nothing to show in stage 2
                hists[m] = total[: int(np.nonzero(total)[0].max()) + 1] / total.sum()
        width = 0.8 / max(len(hists), 1)
        for i, (m, share) in enumerate(hists.items()):
            ax.bar(np.arange(len(share)) + i * width, share, width, label=m)
        ax.set(title=title, xlabel="count", ylabel="share (pooled over steps and seeds)")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    paths.append(_save(fig, out / "budget.png"))
    paths.append(plot_contrast_vs_gain(out, summary))
    return paths


def plot_contrast_vs_gain(out: Path, summary: dict) -> Path:
    """contrast_vs_gain.png: each run's gain in test success from step 0 to T* against the contrast it found
    (effective ratio; mixed prompts per 1000 generated tokens), one dot per run, one colour per method."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    labels = {"effective_ratio": "effective ratio", "mixed_per_1k_tokens": "mixed prompts per 1k tokens"}
    for (key, label), ax in zip(labels.items(), axes):
        for m, s in summary["methods"].items():
            runs = [r for r in s["runs"].values() if r[key] is not None]
            ax.scatter([r[key] for r in runs], [100 * r["gain_at_tokens"] for r in runs], label=m, s=25)
        ax.set(xlabel=f"{label} (mean over steps)", ylabel="gain in test success, step 0 to T* (points)",
               title=f"contrast against learning: {label}\n(one dot per run)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, out / "contrast_vs_gain.png")
