"""BFCL end to end on the tiny kit: a TRACE tree whose forks go on mid-episode from their anchor's API state; TRACE
steps, a SIGKILL and a resume that samples the same trees (losses equal to float32 rounding); evaluation of the
policy (accuracy per subset, each entry's calls as JSONL) and of call files produced elsewhere, as bfcl scores them."""

import json
import sys

import jax
import numpy as np
from bfcl_replay import bfcl_valid
from processes import ONE_DEVICE_CLI, assert_rows_close, float32_tolerance, kill_once_saved, logged_rows

from trace_jax.allocation import Allocator, Plan
from trace_jax.cli import main
from trace_jax.config import TrainConfig, load_config
from trace_jax.envs.bfcl.data import load_entries
from trace_jax.envs.bfcl.family import BfclTask
from trace_jax.envs.bfcl.kit import EVAL_IDS
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.host import expand_host


def args(kit, tmp_path, *extra):
    return ["--config", "configs/bfcl_tiny.yaml", f"task.policy_dir={kit / 'policy'}", f"data_dir={tmp_path / 'tfds'}",
            "pool_size=4", "roots=4", "warmup.batches=0", *extra]


def test_forks_go_on_mid_episode_from_their_anchor(bfcl_kit, tmp_path):
    config, path, *overrides = args(bfcl_kit, tmp_path, f"out_dir={tmp_path / 'run'}")
    cfg = load_config(TrainConfig, path, overrides)
    task = BfclTask(cfg)
    assert json.loads((tmp_path / "run" / "split.json").read_text())["eval"] == list(EVAL_IDS)
    plan = Plan(Allocator("uniform_tree", group_size=2), roots=4, continuations=6)
    tree, _, _ = expand_host(task.base_policy(None), task.env, task.pool(1, None), jax.random.key(3), plan=plan,
                             sampling=SamplingConfig(1.0), pad_id=task.pad_id)
    tree = jax.device_get(tree)
    forks = np.flatnonzero(tree.is_continuation & (tree.branch_turn >= 0))
    mid = [s for s in forks if tree.num_turns[s] > tree.branch_turn[s] + 1]
    assert mid, "no fork acted after its anchor"
    assert task.env.hits > 0  # their first steps acted on a copy of the anchor's API state
    assert any(tree.reward[s] == 1.0 for s in forks)  # and some passed bfcl's checks from there


def test_trace_steps_resume_exactly_after_a_kill_and_evaluate(bfcl_kit, tmp_path, capsys):
    steps = ("steps=2", "eval_every=2", "checkpoint_every=1")
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert main(["train", *args(bfcl_kit, tmp_path, *steps, f"out_dir={full}")]) == 0
    rows = logged_rows(full / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["continuations"] > 0 and r["tool_calls"] > 0 for r in rows[1:])
    assert {"eval/base/accuracy", "eval/overall/accuracy"} <= set(rows[0])

    cmd = [sys.executable, ONE_DEVICE_CLI, "train", *args(bfcl_kit, tmp_path, *steps, f"out_dir={killed}")]
    kill_once_saved(cmd, killed / "checkpoints" / "1" / "meta")
    assert not (killed / "checkpoints" / "2").exists(), "the run finished before it could be killed"
    assert main(["train", *args(bfcl_kit, tmp_path, *steps, f"out_dir={killed}"), "--resume"]) == 0
    a, b = logged_rows(full / "metrics.jsonl"), logged_rows(killed / "metrics.jsonl")
    assert [r["step"] for r in b] == [0, 1, 2]
    assert_rows_close(a[2:], b[2:], float32_tolerance)  # the step after the resume: losses to float32 rounding
    sampled = ("generated_tokens", "continuations", "leaves", "tool_calls", "reward", "effective_ratio")
    assert [[r[k] for k in sampled] for r in a[2:]] == [[r[k] for k in sampled] for r in b[2:]]  # the same trees
    assert [r for r in logged_rows(full / "eval_calls.jsonl") if r["step"] == 2] == [
        r for r in logged_rows(killed / "eval_calls.jsonl") if r["step"] == 2]  # the same calls, call for call

    capsys.readouterr()
    assert main(["eval", *args(bfcl_kit, tmp_path), "--checkpoint", str(full / "hf")]) == 0
    scores = json.loads((full / "eval" / "eval.json").read_text())
    lines = [json.loads(line) for line in (full / "eval" / "eval_calls.jsonl").read_text().splitlines()]
    assert [r["id"] for r in lines] == list(EVAL_IDS) and all(r["subset"] == "base" for r in lines)
    assert np.mean([r["reward"] for r in lines]) == scores["eval/base/accuracy"] == scores["eval/overall/accuracy"]
    entries = {e.id: e for e in load_entries(("base",))}
    for r in lines:  # the env's verdict is bfcl's on the same calls, where the episode ended in its checks
        if r["failure"] is None or "cut off" not in r["failure"]:
            assert bfcl_valid(entries[r["id"]], r["calls"]) == (r["reward"] == 1.0), r
    said = capsys.readouterr().out
    assert "| base | 2 |" in said and "calls decoded as bfcl's Qwen handler decodes them" in said
    assert main(["eval", *args(bfcl_kit, tmp_path), "task.decoding=lenient", "--checkpoint", str(full / "hf"),
                 "--out", str(tmp_path / "lenient")]) == 0  # the other decoding, named in what eval says
    assert "calls decoded leniently (task.decoding=lenient: not bfcl's figure" in capsys.readouterr().out


def test_eval_calls_scores_call_files_as_bfcl_does(bfcl_kit, tmp_path, capsys):
    entries = {e.id: e for e in load_entries(("base",))}
    truth = {i: [[list(calls)] if calls else [] for calls in entries[i].ground_truth] for i in EVAL_IDS}
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join(json.dumps({"id": i, "calls": c}) + "\n" for i, c in truth.items()))
    assert main(["eval", *args(bfcl_kit, tmp_path), "--calls", str(calls)]) == 0
    scores = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert scores["eval/base/accuracy"] == 1.0 and scores["eval/overall/entries"] == 2

    dropped = {i: [[step[:-1] if t == len(c) - 1 else step for step in turn] for t, turn in enumerate(c)]
               for i, c in truth.items()}  # the last turn's last call left out
    calls.write_text("".join(json.dumps({"id": i, "calls": c}) + "\n" for i, c in dropped.items()))
    assert main(["eval", *args(bfcl_kit, tmp_path), "--calls", str(calls)]) == 0
    lines = [json.loads(line) for line in (tmp_path / "eval" / "eval_calls.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in lines] == [float(bfcl_valid(entries[i], c)) for i, c in dropped.items()]
    assert all(r["failure"] for r in lines if not r["reward"])

    calls.write_text(json.dumps({"id": "nope", "calls": []}) + "\n")
    assert main(["eval", *args(bfcl_kit, tmp_path), "--calls", str(calls)]) == 2
    assert "entry id 'nope' is in no subset" in capsys.readouterr().err
    calls.write_bytes(b'\n{"id": "\xff"}\n')  # a byte no UTF-8 text holds, on line 2
    assert main(["eval", *args(bfcl_kit, tmp_path), "--calls", str(calls)]) == 2
    assert f"{calls}:2: not UTF-8" in capsys.readouterr().err
    assert main(["eval", *args(bfcl_kit, tmp_path), "--responses", str(calls)]) == 2  # the other family's flag
    assert "env=bfcl takes --calls" in capsys.readouterr().err
