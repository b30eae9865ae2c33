"""A task family is a plug-in: the counter toy (tests/counter_family.py), a stateful tool kept outside the package and
named by `env=module:attribute`, runs through the commands HopWorld runs through: train, eval, show-tree,
plan-memory and compare --quick (docs/adding_a_task.md)."""

import json

from trace_jax.cli import main
from trace_jax.metrics import read_metrics

TOY = ["env=counter_family:FAMILY", "task.max_turns=3", "pool_size=8", "roots=8", "continuations=2", "group_size=2",
       "warmup.batches=2", "warmup.fit_steps=20", "pack_rows=0", "eval_every=2"]
OUTPUTS = {"summary.json", "results.md", "success_vs_tokens.png", "effective_ratio.png", "budget.png"}


def test_the_counter_family_trains_evaluates_shows_its_tree_and_plans_memory(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TOY, f"out_dir={run}", "steps=2", "checkpoint_every=1"]) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(0 <= rows[s]["eval/success"] <= 1 for s in (0, 2)) and rows[0]["warmup/train_nodes"] > 0
    assert rows[1]["continuations"] > 0 and rows[1]["tool_calls"] > 0 and rows[1]["rollout_seconds"] > 0
    assert "train: counter, trace" in capsys.readouterr().out

    assert main(["eval", *TOY, "--checkpoint", str(run / "policy")]) == 0
    scores = json.loads((run / "eval" / "eval.json").read_text())
    assert set(scores) == {"eval/success"} and scores["eval/success"] * 16 == round(scores["eval/success"] * 16)

    assert main(["show-tree", "--run", str(run), "--out", str(tmp_path / "tree.png")]) == 0
    assert (tmp_path / "tree.png").stat().st_size > 0 and "root rollouts" in capsys.readouterr().out

    assert main(["plan-memory", *TOY, "--chip", "cpu", "--chips", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"] == "tests/counter_family.py" and plan["total_bytes"] > 0


def test_a_family_refuses_settings_it_does_not_have_before_any_work(tmp_path, capsys):
    assert main(["train", *TOY, "task.colour=red", f"out_dir={tmp_path / 'run'}"]) == 2
    assert "unknown config key 'task.colour'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["train", "env=no_such_family", f"out_dir={tmp_path / 'run'}"]) == 2
    assert "env='no_such_family' is not a task family" in capsys.readouterr().err
    assert main(["train", "task.colour=red", f"out_dir={tmp_path / 'run'}"]) == 2  # HopWorld takes no task.*
    assert "env=hopworld takes no task.* settings" in capsys.readouterr().err


def test_compare_quick_on_the_counter_family_writes_a_results_folder(tmp_path):
    out = tmp_path / "compare"
    assert main(["compare", "--quick", *(f"train.{a}" for a in TOY), "seeds=1", "methods=[trace,grpo]",
                 "train.steps=2", "train.eval_every=2", f"out_dir={out}"]) == 0
    assert {p.name for p in out.iterdir()} >= OUTPUTS
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"trace", "grpo"} and summary["tokens_at"] > 0
    assert summary["methods"]["trace"]["mean"]["success_start"] == summary["methods"]["grpo"]["mean"]["success_start"]
