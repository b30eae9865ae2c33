"""`trace-jax compare`: fair methods, numbers read from the raw metrics at equal cumulative tokens, a quick run
end to end."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import yaml

from toy import TINY_POLICY
from trace_jax import sharding as shd
from trace_jax.checkpoints import save_model
from trace_jax.cli import main
from trace_jax.compare.methods import check_fair, method_config, method_fields
from trace_jax.compare.summary import markdown_table, run_stats, summarize
from trace_jax.config import TrainConfig, load_config
from trace_jax.metrics import MetricsLogger


def test_methods_differ_only_in_allocator_fields_and_budgets():
    base = TrainConfig()
    configs = {m: method_config(base, m, out_dir=f"runs/{m}") for m in ("trace", "grpo_matched", "trace@32x6")}
    check_fair(configs)
    assert configs["grpo_matched"].match_group_size and configs["grpo_matched"].allocator == "grpo"
    assert (configs["trace@32x6"].roots, configs["trace@32x6"].continuations) == (32, 6)
    unfair = dict(configs, grpo_matched=dataclasses.replace(configs["grpo_matched"], learning_rate=1e-4))
    with pytest.raises(ValueError, match=r"differ in \['learning_rate'\]"):
        check_fair(unfair)
    nested = dict(configs, trace=dataclasses.replace(base, warmup=dataclasses.replace(base.warmup, batches=3)))
    with pytest.raises(ValueError, match=r"warmup.batches"):
        check_fair(nested)
    with pytest.raises(ValueError, match="unknown method 'tracey'"):
        method_fields("tracey")


def _log(path, evals: dict[int, float], tokens: list[int], ratio: float = 0.5):
    with MetricsLogger(path) as log:
        for step in range(len(tokens) + 1):
            row = {} if step == 0 else {"generated_tokens": tokens[step - 1], "effective_ratio": ratio,
                                        "leaves": 8, "prompts": 2}
            if step in evals:
                row["eval/success"] = evals[step]
            log.log(step, row)


def test_success_is_read_at_equal_cumulative_tokens(tmp_path):
    # run a: 100 tokens a step, evals at steps 0, 2, 4 (0, 200, 400 tokens); run b: 50 a step (T* = 200)
    _log(tmp_path / "runs/a/seed0", {0: 0.5, 2: 0.7, 4: 0.9}, [100] * 4)
    _log(tmp_path / "runs/b/seed0", {0: 0.5, 4: 0.6}, [50] * 4, ratio=0.25)
    s = summarize(tmp_path, ["a", "b"], [0])
    assert s["tokens_at"] == 200
    assert s["methods"]["a"]["mean"]["success_at_tokens"] == pytest.approx(0.7)  # a's step-2 evaluation
    assert s["methods"]["b"]["mean"]["success_at_tokens"] == pytest.approx(0.6)
    assert s["methods"]["a"]["std"]["success_at_tokens"] == 0.0  # one seed
    assert s["methods"]["a"]["mean"]["success_end"] == pytest.approx(0.9)
    assert s["methods"]["b"]["mean"]["mixed_prompts"] == pytest.approx(0.25 * 2)
    # between evaluations: linear in tokens
    rows = [json.loads(line) for line in (tmp_path / "runs/a/seed0/metrics.jsonl").read_text().splitlines()]
    assert run_stats(rows, 300)["success_at_tokens"] == pytest.approx(0.8)
    one_seed = markdown_table(s)  # one run per method: no spread, no interval, and nothing reads as NaN
    assert "| b | 60.0% |" in one_seed and "One run per method" in one_seed
    assert "| a - b | +10.0% | +10.0% | none: one seed" in one_seed and "nan" not in one_seed
    # over seeds: mean and sample std per method; T* is the fewest tokens of any run of any seed
    _log(tmp_path / "runs/a/seed1", {0: 0.5, 4: 0.5}, [100] * 4)
    _log(tmp_path / "runs/b/seed1", {0: 0.5, 3: 0.9}, [50] * 3)  # 150 tokens in all
    s = summarize(tmp_path, ["a", "b"], [0, 1])
    assert s["tokens_at"] == 150 and s["seeds"] == [0, 1]
    a = [0.5 + (0.7 - 0.5) * 150 / 200, 0.5 + (0.5 - 0.5) * 150 / 400]  # each seed's success at 150 tokens
    assert s["methods"]["a"]["runs"]["1"]["success_at_tokens"] == pytest.approx(a[1])
    assert s["methods"]["a"]["mean"]["success_at_tokens"] == pytest.approx(np.mean(a))
    assert s["methods"]["a"]["std"]["success_at_tokens"] == pytest.approx(np.std(a, ddof=1))
    assert s["methods"]["b"]["mean"]["success_end"] == pytest.approx((0.6 + 0.9) / 2)
    # the first method minus each other, paired by seed
    b = [s["methods"]["b"]["runs"][k]["success_at_tokens"] for k in ("0", "1")]
    paired = s["paired"]["methods"]["b"]
    assert s["paired"]["reference"] == "a" and list(s["paired"]["methods"]) == ["b"]
    assert paired["diffs"] == {"0": pytest.approx(a[0] - b[0]), "1": pytest.approx(a[1] - b[1])}
    d = np.subtract(a, b)
    half = 12.706204736174707 * d.std(ddof=1) / np.sqrt(2)  # Student t, 1 degree of freedom, 97.5% quantile
    assert (paired["low"], paired["high"]) == (pytest.approx(d.mean() - half), pytest.approx(d.mean() + half))
    assert f"| a - b | {a[0] - b[0]:+.1%}, {a[1] - b[1]:+.1%} |" in markdown_table(s)
    assert s["methods"]["a"]["runs"]["0"]["gain_at_tokens"] == pytest.approx(a[0] - 0.5)  # from step 0 to T*
    assert s["methods"]["b"]["runs"]["0"]["mixed_per_1k_tokens"] == pytest.approx(1000 * 0.25 * 2 / 50)
    gains = [s["methods"][m]["runs"][k]["gain_at_tokens"] for m in ("a", "b") for k in ("0", "1")]
    for key, per_run in (("effective_ratio", [0.5, 0.5, 0.25, 0.5]), ("mixed_per_1k_tokens", [10, 10, 10, 20])):
        assert [s["methods"][m]["runs"][k][key] for m in ("a", "b") for k in ("0", "1")] == pytest.approx(per_run)
        assert s["contrast_gain_correlation"][key] == pytest.approx(np.corrcoef(per_run, gains)[0, 1]), key
    # a run with no evaluation (cut short before step 0's was logged) is named, not a bare max() error
    _log(tmp_path / "runs/c/seed0", {}, [50] * 2)
    with pytest.raises(ValueError, match=r"runs/c/seed0: no test evaluation \(eval/success\)"):
        summarize(tmp_path, ["a", "c"], [0])


def _evals(run, step: int) -> dict:
    """The eval/* numbers a run logged at `step`."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {k: v for r in rows if r["step"] == step for k, v in r.items() if k.startswith("eval/")}


# The compare notebook's test sizes (launch/colab/compare.ipynb's TINY): the two share most of their compiled programs.
QUICK_TINY = ["train.world.num_entities=64", "train.world.num_questions=120", "train.pool_size=4", "train.roots=4",
              "train.continuations=1", "train.group_size=2", "train.eval_batch=16", "train.eval_samples=1",
              "train.steps=2", "train.eval_every=2", "train.warmup.batches=1", "train.warmup.fit_steps=20",
              "train.checkpoint_every=2"]


def test_quick_compare_end_to_end_from_raw_metrics(tmp_path, capsys):
    save_model(tmp_path / "base", 0, shd.init_policy(TINY_POLICY, seed=0))
    out = tmp_path / "cmp"
    args = [*QUICK_TINY, "seeds=1", "train.seed=3", f"train.init_checkpoint={tmp_path / 'base'}",
            f"train.data_dir={tmp_path / 'tfds'}", f"out_dir={out}", f"train.checkpoint_dir={tmp_path / 'ckpts'}"]
    assert main(["compare", "--quick", "--methods", "trace,grpo_matched", *args]) == 0
    protocol = (out / "PROTOCOL.md").read_text()
    for fact in ("`trace`: TRACE", "`grpo_matched`: GRPO whose group size", "**Seeds**: 3, fixed", "at steps 0, 2.",
                 "`trace` minus each other method at T*, paired by seed", "M = 4 root rollouts, N = 1"):
        assert fact in protocol, fact
    for name in ("summary.json", "results.md", "success_vs_tokens.png", "effective_ratio.png", "reliability.png",
                 "budget.png", "contrast_vs_gain.png", "PROTOCOL.md"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [3] and set(summary["methods"]) == {"trace", "grpo_matched"}
    # the runs that were compared are fair, as saved, and start from the same step-0 evaluation
    check_fair({m: load_config(TrainConfig, out / f"runs/{m}/seed3/config.yaml") for m in ("trace", "grpo_matched")})
    step0 = [_evals(out / f"runs/{m}/seed3", 0) for m in ("trace", "grpo_matched")]
    assert step0[0] and step0[0] == step0[1]
    # the table follows the raw file: change trace's last evaluation and re-summarize
    raw = out / "runs/trace/seed3/metrics.jsonl"
    rows = [json.loads(line) for line in raw.read_text().splitlines()]
    before = summarize(out, ["trace", "grpo_matched"], [3])["methods"]["trace"]["mean"]["success_end"]
    assert before == pytest.approx(summary["methods"]["trace"]["mean"]["success_end"])
    rows[-1]["eval/success"] = rows[-1]["eval/success"] + 0.5
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    after = summarize(out, ["trace", "grpo_matched"], [3])["methods"]["trace"]["mean"]["success_end"]
    assert after == pytest.approx(before + 0.5)
    # a second call reuses the finished runs; a changed config in the same folder is refused by name
    assert main(["compare", "--quick", "--methods", "trace,grpo_matched", *args]) == 0
    assert "reusing it" in capsys.readouterr().out
    # each run checkpoints in its own folder under train.checkpoint_dir; a run stopped midway (preempted: a
    # checkpoint, no policy yet) is continued from its checkpoint there
    assert {p.name for p in (tmp_path / "ckpts").iterdir() if any(p.glob("seed3/*/meta"))} == {"trace", "grpo_matched"}
    shutil.rmtree(out / "runs/grpo_matched/seed3/policy")
    assert main(["compare", "--quick", "--methods", "trace,grpo_matched", *args]) == 0
    out_text = capsys.readouterr().out
    assert "compare: grpo_matched, seed 3" in out_text and "holds this run's checkpoint at step 2" in out_text
    assert (out / "runs/grpo_matched/seed3/policy").is_dir()
    assert main(["compare", "--quick", "--methods", "trace", *args, "train.learning_rate=0.02"]) == 2
    assert (out / "PROTOCOL.md").read_text() == protocol  # written once, before the runs it describes
    assert np.isfinite(yaml.safe_load((out / "compare.yaml").read_text())["train"]["learning_rate"])
    # one of the runs' trees, drawn
    assert main(["show-tree", "--run", str(out / "runs/trace/seed3"), "--out", str(tmp_path / "tree.png")]) == 0
    assert (tmp_path / "tree.png").stat().st_size > 0
