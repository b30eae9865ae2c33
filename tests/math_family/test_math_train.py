"""Math end to end on the tiny kit: a TRACE tree whose forks resume mid-episode from the interpreter's state at
their anchor; TRACE steps, a SIGKILL and a resume that samples the same trees (losses equal to float32 rounding, as
two processes' compiled steps give); evaluation of the policy and of responses produced elsewhere."""

import json
import sys

import jax
import numpy as np
from processes import ONE_DEVICE_CLI, assert_rows_close, float32_tolerance, kill_once_saved, logged_rows

from trace_jax.allocation import Allocator, Plan
from trace_jax.cli import main
from trace_jax.config import TrainConfig, load_config
from trace_jax.envs.math.env import MathEnv
from trace_jax.envs.math.family import MathTask
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.host import expand_host


def args(kit, tmp_path, *extra):
    return ["--config", "configs/math_tiny.yaml", f"task.policy_dir={kit / 'policy'}",
            f"task.problems_dir={kit / 'problems'}", f"data_dir={tmp_path / 'tfds'}", "pool_size=4", "roots=4",
            "group_size=2", "warmup.batches=1", *extra]


def test_forks_resume_mid_episode_from_the_interpreter_state_at_their_anchor(math_kit, tmp_path):
    cfg = load_config(TrainConfig, None, args(math_kit, tmp_path)[2:])
    task = MathTask(cfg)
    plan = Plan(Allocator("uniform_tree", group_size=2), roots=4, continuations=6)
    tree, _, _ = expand_host(task.base_policy(None), task.env, task.pool(1, None), jax.random.key(3), plan=plan,
                             sampling=SamplingConfig(1.0), pad_id=task.pad_id)
    tree = jax.device_get(tree)
    fresh = MathEnv(task.tokenizer, task.answers, task.m, task.sandbox, task.verifier, cache_size=0)
    mid_episode = 0
    for s in np.flatnonzero(tree.is_continuation):
        start, actions, observations = int(tree.prompt_len[s]), [], []
        for end in tree.boundaries[s, : tree.num_turns[s]]:
            span, mask = tree.tokens[s, start:end], tree.policy_mask[s, start:end]
            actions.append(span[mask])
            observations.append(span[~mask].tolist())
            start = end
        mid_episode += int(tree.branch_turn[s]) >= 0 and len(actions) > int(tree.branch_turn[s]) + 1
        q = int(tree.question[s])
        for t, action in enumerate(actions):  # the fork's observations are its own history's, replayed afresh
            state = fresh._restore((q, *(a.tobytes() for a in actions[:t])), actions[:t])
            obs = fresh._turns([state], [q], [t], [action], [actions[:t]])[0][0]
            assert obs.tolist()[: task.m.obs_len] == observations[t], (s, t)
    assert mid_episode > 0  # forks that ran code after their anchor
    assert fresh.replays > 0


def test_trace_steps_resume_exactly_after_a_kill_and_evaluate(math_kit, tmp_path, capsys):
    steps = ("steps=3", "eval_every=3", "checkpoint_every=1")
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert main(["train", *args(math_kit, tmp_path, *steps, f"out_dir={full}")]) == 0
    rows = logged_rows(full / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["continuations"] > 0 and r["tool_calls"] > 0 for r in rows[1:])
    assert {"eval/kit/accuracy", "eval/kit/tool_calls", "eval/kit/no_answer", "eval/average/accuracy"} <= set(rows[0])

    cmd = [sys.executable, ONE_DEVICE_CLI, "train", *args(math_kit, tmp_path, *steps, f"out_dir={killed}")]
    kill_once_saved(cmd, killed / "checkpoints" / "1" / "meta")
    assert not (killed / "checkpoints" / "3").exists(), "the run finished before it could be killed"
    assert main(["train", *args(math_kit, tmp_path, *steps, f"out_dir={killed}"), "--resume"]) == 0
    a, b = logged_rows(full / "metrics.jsonl"), logged_rows(killed / "metrics.jsonl")
    assert [r["step"] for r in b] == [0, 1, 2, 3]
    assert_rows_close(a[2:], b[2:], float32_tolerance)  # the steps after the resume: losses to float32 rounding
    sampled = ("generated_tokens", "continuations", "leaves", "tool_calls", "reward", "effective_ratio")
    assert [[r[k] for k in sampled] for r in a[2:]] == [[r[k] for k in sampled] for r in b[2:]]  # the same trees
    assert_rows_close(logged_rows(full / "allocation.jsonl"), logged_rows(killed / "allocation.jsonl"),
                      float32_tolerance)  # the same roots and continuations for the same readings
    assert [r for r in logged_rows(full / "eval_answers.jsonl") if r["step"] == 3] == [
        r for r in logged_rows(killed / "eval_answers.jsonl") if r["step"] == 3]  # the same answers, token for token

    capsys.readouterr()
    assert main(["eval", *args(math_kit, tmp_path), "--checkpoint", str(full / "hf")]) == 0
    scores = json.loads((full / "eval" / "eval.json").read_text())
    answers = [json.loads(line) for line in (full / "eval" / "eval_answers.jsonl").read_text().splitlines()]
    assert len(answers) == 8 and all(a["set"] == "kit" and a["response"] for a in answers)
    assert np.mean([a["reward"] for a in answers]) == scores["eval/kit/accuracy"]
    said = capsys.readouterr().out
    assert "| kit | 8 |" in said and "the policy of training step 3" in said
    # the run's final policy, drawn with that step's evaluation key: what training's final evaluation answered
    assert answers == [{k: v for k, v in r.items() if k != "step"}
                       for r in logged_rows(full / "eval_answers.jsonl") if r["step"] == 3]
    assert scores["eval/kit/accuracy"] == rows[-1]["eval/kit/accuracy"]
    assert main(["eval", *args(math_kit, tmp_path), "--checkpoint", str(full / "hf"), "--step", "0",
                 "--out", str(tmp_path / "eval0")]) == 0  # another step's key draws other episodes
    assert "drawn with step 0's evaluation key" in capsys.readouterr().out

    # the same answers graded from a file, as another model's would be
    responses = tmp_path / "responses.jsonl"
    responses.write_text("".join(json.dumps({"id": a["id"], "response": a["response"]}) + "\n" for a in answers))
    assert main(["eval", *args(math_kit, tmp_path), "--responses", str(responses)]) == 0
    graded = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert graded["eval/kit/accuracy"] == scores["eval/kit/accuracy"] and graded["eval/kit/responses"] == 8
    responses.write_text(json.dumps({"id": "nope", "response": "\\boxed{1}"}) + "\n")
    assert main(["eval", *args(math_kit, tmp_path), "--responses", str(responses)]) == 2
    assert "problem id 'nope' is in no evaluation set" in capsys.readouterr().err
    first = json.dumps({"id": answers[0]["id"], "response": "\\boxed{1}"}).encode()
    responses.write_bytes(first + b'\n{"id": "b", "response": "\xff"}\n')  # a byte no UTF-8 text holds
    assert main(["eval", *args(math_kit, tmp_path), "--responses", str(responses)]) == 2
    assert f"{responses}:2: not UTF-8" in capsys.readouterr().err
