"""Search QA end to end on CPU through the real HTTP retriever on loopback: TRACE steps, a retriever that dies
mid-run, the resume, evaluation and the HF export."""

import json

import numpy as np
import pytest
from flax import nnx

from trace_jax.cli import main
from trace_jax.metrics import read_metrics


def args(kit, tmp_path, url, *extra):
    return ["--config", "configs/searchqa_tiny.yaml", f"search_qa.policy_dir={kit / 'policy'}",
            f"search_qa.qa_dir={kit / 'qa'}", f"search_qa.retriever.url={url}", f"out_dir={tmp_path / 'run'}",
            f"data_dir={tmp_path / 'tfds'}", "search_qa.eval_questions=4", "pool_size=4", "roots=4",
            "group_size=2", "warmup.batches=1", *extra]


def test_trace_steps_a_dead_retriever_resume_evaluation_and_export(kit, serve, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from trace_jax.models.hf_io import from_pretrained

    run = tmp_path / "run"
    url, searcher = serve(fail_when=lambda: (run / "checkpoints" / "1").is_dir())  # dies after step 1 is saved
    extra = ("steps=2", "eval_every=2", "checkpoint_every=1", "search_qa.retriever.retries=1",
             "search_qa.retriever.timeout_s=1", "search_qa.retriever.backoff_s=0.01")
    assert main(["train", *args(kit, tmp_path, url, *extra)]) == 2
    err = capsys.readouterr().err
    assert f"retriever at {url} failed 2 times" in err and "trace-jax retrieve serve" in err
    first, last = read_metrics(run)
    assert last["step"] == 1 and last["generated_tokens"] > 0 and last["continuations"] > 0 and not last["skipped"]
    assert {"eval/nq/em", "eval/hotpotqa/f1", "eval/average/em", "eval/weighted/sub_em"} <= set(first)
    assert first["warmup/train_nodes"] > 0  # the predictor warm-up ran through the host path
    assert searcher.queries > 0  # the policy searched, through HTTP

    # the checkpoint of step 1 is whole: with a live retriever the run resumes from it
    url2, _ = serve()
    assert main(["train", *args(kit, tmp_path, url2, *extra[:3]), "--resume", "--allow-config-change"]) == 0
    assert [r["step"] for r in read_metrics(run)] == [0, 1, 2]
    assert "eval/weighted/em" in read_metrics(run)[-1]
    assert "resumed from step 1" in capsys.readouterr().out
    logged = [json.loads(line) for line in (run / "eval_answers.jsonl").read_text().splitlines()]
    datasets = ["nq"] * 4 + ["hotpotqa"] * 4  # step 0's answers kept, step 2's written after the resume
    assert [(a["step"], a["dataset"]) for a in logged] == [(s, d) for s in (0, 2) for d in datasets]

    # the export loads in transformers and computes what our model computes
    hf = Qwen3ForCausalLM.from_pretrained(run / "hf").eval()
    ids = np.array([AutoTokenizer.from_pretrained(run / "hf").encode("<search> where was it </search>")])
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    forward = nnx.jit(lambda model: model(ids))  # one program (eagerly, each of the forward's ops would compile)
    after = forward(from_pretrained(run / "hf"))
    np.testing.assert_allclose(np.asarray(after.logits), want, atol=1e-4, rtol=1e-4)
    before = forward(from_pretrained(kit / "policy"))
    assert np.abs(np.asarray(before.logits) - want).max() > 1e-6  # the steps changed the policy
    assert np.abs(np.asarray(after.success - before.success)).max() > 1e-3  # and the head

    assert main(["eval", *args(kit, tmp_path, url2), "--checkpoint", str(run / "hf")]) == 0
    scores = json.loads((run / "eval" / "eval.json").read_text())
    assert set(scores) == {f"eval/{d}/{m}" for d in ("nq", "hotpotqa", "average", "weighted")
                           for m in ("em", "f1", "sub_em")}
    assert "| weighted | 8 |" in (run / "eval" / "eval.md").read_text()
    answers = [json.loads(line) for line in (run / "eval" / "eval_answers.jsonl").read_text().splitlines()]
    assert [a["dataset"] for a in answers] == ["nq"] * 4 + ["hotpotqa"] * 4 and all(a["response"] for a in answers)
    assert all(a["em"] == a["reward"] for a in logged + answers)  # EM is what the environment rewarded
    assert np.mean([a["f1"] for a in answers if a["dataset"] == "nq"]) == scores["eval/nq/f1"]


def test_the_run_loads_its_policy_in_search_qa_dtype(kit):
    """`search_qa.dtype` reaches the run's policy: float32 weights computing in bfloat16 (mixed precision)."""
    from trace_jax.config import TrainConfig, load_config
    from trace_jax.envs.search_qa.family import load_policy

    cfg = load_config(TrainConfig, "configs/searchqa_tiny.yaml",
                      [f"search_qa.policy_dir={kit / 'policy'}", "search_qa.dtype=bfloat16", "predictor_layers=1"])
    model = load_policy(cfg)
    assert (model.cfg.param_dtype, model.cfg.dtype, model.cfg.predictor_layers) == ("float32", "bfloat16", 1)
    assert model.layers[0].mlp.up_proj[...].dtype == model.predictor[0].mlp.up_proj[...].dtype == np.float32


def test_compare_on_the_tiny_kit_writes_the_results_folder_hopworld_writes(kit, serve, tmp_path):
    """`compare` runs every task family: on search QA through the live retriever, the shared warm-up, the methods at
    equal cost and the summary read at equal tokens from its success metric (EM averaged over datasets). The folder
    holds what a HopWorld comparison writes (tests/test_compare.py), but the reliability plot: search QA's evaluation
    logs no V~ reliability."""
    url, searcher = serve()
    out = tmp_path / "compare"
    train = [f"train.{a}" for a in args(kit, tmp_path, url, "steps=1", "eval_every=1")[2:]]
    assert main(["compare", *train, "train.env=search_qa", "train.search_qa.max_turns=3",
                 "train.search_qa.action_len=32", "train.search_qa.obs_len=64", "train.search_qa.prompt_len=160",
                 "seeds=1", "methods=[trace,grpo]", f"out_dir={out}"]) == 0
    assert {"summary.json", "results.md", "success_vs_tokens.png", "effective_ratio.png", "budget.png"} <= {
        p.name for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success_metric"] == "eval/average/em" and set(summary["methods"]) == {"trace", "grpo"}
    trace, grpo = (read_metrics(out / "runs" / m / "seed0") for m in ("trace", "grpo"))
    assert trace[0]["eval/average/em"] == grpo[0]["eval/average/em"]  # one shared start, evaluated once
    assert trace[1]["continuations"] > 0 and grpo[1]["continuations"] == 0 and searcher.queries > 0
    assert (out / "runs" / "trace" / "seed0" / "hf" / "config.json").is_file()
