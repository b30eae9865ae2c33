"""The comparison's numbers, computed only from the runs' raw metrics (`metrics.jsonl`).

Equal cost is judged on cumulative generated policy tokens: every method's test success is read at the same
cumulative tokens T* (the fewest any run reached), linearly interpolated between its evaluations.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy import stats

from trace_jax.compare.protocol import CONFIDENCE
from trace_jax.metrics import read_metrics

# per-run statistic -> (table header, format); the table shows mean ± sample std over seeds
COLUMNS = {
    "success_at_tokens": ("test success @ T*", "{:.1%}"),
    "success_start": ("test success, step 0", "{:.1%}"),
    "success_end": ("test success, last step", "{:.1%}"),
    "gain_at_tokens": ("gain @ T*", "{:+.1%}"),
    "effective_ratio": ("effective ratio", "{:.3f}"),
    "mixed_prompts": ("mixed prompts/step", "{:.2f}"),
    "solve_none": ("solve_none", "{:.3f}"),
    "solve_all": ("solve_all", "{:.3f}"),
    "generated_tokens": ("tokens/step", "{:.0f}"),
    "mixed_per_1k_tokens": ("mixed prompts/1k tokens", "{:.2f}"),
    "leaves": ("leaves/step", "{:.1f}"),
    "prompts": ("prompts/step", "{:.1f}"),
    "root_auc": ("root AUC (train)", "{:.3f}"),
    "prefix_auc": ("prefix AUC (train)", "{:.3f}"),
    "eval_root_auc": ("root AUC (test, end)", "{:.3f}"),
    "eval_root_ece": ("root ECE (test, end)", "{:.3f}"),
}
SUCCESS = "eval/success"  # the test success key a family's evaluation logs, unless it names another (`Family`)
STEP_MEANS = ("effective_ratio", "solve_none", "solve_all", "generated_tokens", "leaves", "prompts", "root_auc",
              "prefix_auc")


def run_curves(rows: Sequence[dict], metric: str = SUCCESS) -> dict[str, np.ndarray]:
    """Per step (step 0 first): step [K+1], cumulative generated tokens [K+1]; and evaluations: eval_step [E],
    eval_tokens [E] (cumulative tokens at each evaluation), eval_success [E] (the family's test success `metric`)."""
    steps = sorted((r for r in rows if r["step"] > 0), key=lambda r: r["step"])
    tokens = np.concatenate([[0.0], np.cumsum([r["generated_tokens"] for r in steps])])
    step = np.array([0] + [r["step"] for r in steps])
    evals = sorted((r for r in rows if r.get(metric) is not None), key=lambda r: r["step"])
    eval_step = np.array([r["step"] for r in evals])
    return {"step": step, "tokens": tokens, "eval_step": eval_step, "eval_tokens": np.interp(eval_step, step, tokens),
            "eval_success": np.array([r[metric] for r in evals])}


def run_stats(rows: Sequence[dict], tokens_at: float, metric: str = SUCCESS) -> dict[str, float]:
    """One run's statistics (COLUMNS) with test success (`metric`) read at `tokens_at` cumulative tokens."""
    c = run_curves(rows, metric)
    steps = [r for r in rows if r["step"] > 0]
    last_eval = max((r for r in rows if r.get(metric) is not None), key=lambda r: r["step"])
    out = {"success_at_tokens": float(np.interp(tokens_at, c["eval_tokens"], c["eval_success"])),
           "success_start": float(c["eval_success"][0]), "success_end": float(c["eval_success"][-1]),
           "eval_root_auc": last_eval.get("eval/root_auc"), "eval_root_ece": last_eval.get("eval/root_ece")}
    for key in STEP_MEANS:
        values = [r[key] for r in steps if r.get(key) is not None]
        out[key] = float(np.mean(values)) if values else None
    # the effective ratio is a share of the opened prompts; this counts them (one prompt opened: at most 1)
    mixed = [r["effective_ratio"] * r["prompts"] for r in steps
             if r.get("effective_ratio") is not None and r.get("prompts") is not None]
    out["mixed_prompts"] = float(np.mean(mixed)) if mixed else None
    out["gain_at_tokens"] = out["success_at_tokens"] - out["success_start"]
    out["mixed_per_1k_tokens"] = (1000 * out["mixed_prompts"] / out["generated_tokens"]
                                  if mixed and out["generated_tokens"] else None)
    return out


def paired_differences(runs: dict[str, dict[str, dict]], reference: str, key: str = "success_at_tokens",
                       confidence: float = 0.95) -> dict[str, dict]:
    """`reference` minus each other method in `key`, paired by seed: {method: {"diffs": {seed: d}, "mean",
    "low", "high"}} with a two-sided Student-t interval over the seeds (none for one seed)."""
    out = {}
    for m, by_seed in runs.items():
        if m == reference:
            continue
        diffs = {s: runs[reference][s][key] - by_seed[s][key] for s in by_seed}
        d = np.array(list(diffs.values()), float)
        half = (stats.t.ppf(0.5 + confidence / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
                if len(d) > 1 else float("nan"))
        out[m] = {"diffs": diffs, "mean": float(d.mean()), "low": float(d.mean() - half),
                  "high": float(d.mean() + half)}
    return out


def contrast_gain_correlation(methods: dict[str, dict]) -> dict[str, float | None]:
    """Pearson correlation over every run (all methods and seeds) of its gain @ T* with the contrast it found
    (effective ratio; mixed prompts per 1000 tokens); None with fewer than 3 runs or no spread."""
    runs = [r for m in methods.values() for r in m["runs"].values()]
    out: dict[str, float | None] = {}
    for key in ("effective_ratio", "mixed_per_1k_tokens"):
        pairs = np.array([(r[key], r["gain_at_tokens"]) for r in runs if r[key] is not None], float).reshape(-1, 2)
        ok = len(pairs) >= 3 and (pairs.std(0) > 0).all()
        out[key] = float(np.corrcoef(pairs.T)[0, 1]) if ok else None
    return out


def summarize(out_dir: str | Path, methods: Sequence[str], seeds: Sequence[int], metric: str = SUCCESS) -> dict:
    """{"tokens_at": T*, "seeds": [...], "methods": {m: {"runs": {seed: stats}, "mean": {...}, "std": {...}}}}
    from out_dir/runs/<method>/seed<s>/metrics.jsonl, test success read from `metric` (the task family's
    `success_metric`); std is the sample std over seeds (0 for one seed)."""
    raw = {(m, s): read_metrics(Path(out_dir) / "runs" / m / f"seed{s}") for m in methods for s in seeds}
    for (m, s), rows in raw.items():
        if not any(r.get(metric) is not None for r in rows):
            raise ValueError(f"{Path(out_dir) / 'runs' / m / f'seed{s}'}: no test evaluation ({metric}) in its "
                             "metrics.jsonl, so it cannot be compared; run the comparison again to finish it")
    tokens_at = min(float(run_curves(rows)["tokens"][-1]) for rows in raw.values())
    result = {"tokens_at": tokens_at, "seeds": list(seeds), "methods": {}}
    if metric != SUCCESS:
        result["success_metric"] = metric
    for m in methods:
        runs = {str(s): run_stats(raw[m, s], tokens_at, metric) for s in seeds}
        mean, std = {}, {}
        for key in COLUMNS:
            values = np.array([r[key] for r in runs.values() if r[key] is not None], float)
            mean[key] = float(values.mean()) if values.size else None
            std[key] = float(values.std(ddof=1)) if values.size > 1 else 0.0
        result["methods"][m] = {"runs": runs, "mean": mean, "std": std}
    result["contrast_gain_correlation"] = contrast_gain_correlation(result["methods"])
    result["paired"] = {"reference": methods[0], "confidence": CONFIDENCE, "methods": paired_differences(
        {m: v["runs"] for m, v in result["methods"].items()}, methods[0], confidence=CONFIDENCE)}
    return result


def markdown_table(summary: dict) -> str:
    """The summary as a Markdown table, mean ± sample std over seeds."""
    n = len(summary["seeds"])
    head = ["method", *(h for h, _ in COLUMNS.values())]
    over = "Mean ± sample std over" if n > 1 else "One run per method:"
    lines = [f"{over} {n} seed{'s' * (n > 1)} ({', '.join(map(str, summary['seeds']))}); "
             f"T* = {summary['tokens_at']:.0f} cumulative generated policy tokens, the fewest any run reached.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, s in summary["methods"].items():
        cells = [m]
        for key, (_, fmt) in COLUMNS.items():
            mean, std = s["mean"][key], s["std"][key]
            spread = fmt.replace("+", "").format(std).rstrip("%")  # a std has no sign
            unit = "%" if fmt.endswith("%}") else ""
            spread = f" ± {spread}{unit}" if n > 1 else ""  # one seed has no spread to show
            cells.append("n/a" if mean is None else f"{fmt.format(mean)}{spread}")
        lines.append("| " + " | ".join(cells) + " |")
    corr = {k: v for k, v in summary.get("contrast_gain_correlation", {}).items() if v is not None}
    if corr:
        n_runs = sum(len(m["runs"]) for m in summary["methods"].values())
        lines += ["", f"Correlation over the {n_runs} runs of the gain @ T* with the contrast a run found: "
                  + ", ".join(f"{k} {v:+.2f}" for k, v in corr.items()) + "."]
    paired = summary.get("paired")
    if paired and paired["methods"]:
        ref = paired["reference"]
        lines += ["", f"{ref} minus each method in test success @ T*, paired by seed: mean and two-sided "
                  f"{paired['confidence']:.0%} Student-t interval over the seeds.", "",
                  "| method | per seed | mean | interval |", "|---|---|---|---|"]
        for m, d in paired["methods"].items():
            per_seed = ", ".join(f"{v:+.1%}" for v in d["diffs"].values())
            interval = (f"[{d['low']:+.1%}, {d['high']:+.1%}]" if len(d["diffs"]) > 1
                        else "none: one seed (run several for an interval)")
            lines.append(f"| {ref} - {m} | {per_seed} | {d['mean']:+.1%} | {interval} |")
    return "\n".join(lines) + "\n"
