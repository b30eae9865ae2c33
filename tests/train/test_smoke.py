"""`trace-jax train --smoke`: a few steps at the config's shapes on random weights, a checkpoint round trip beside
the run (never in its checkpoints), and failures that name what to stage."""

import dataclasses
import json
import re
import socket

import pytest
from test_train import OVERRIDES, run_dirs  # noqa: F401 (run_dirs: the shared dataset fixture)

from toy import TINY_POLICY
from trace_jax.cli import main
from trace_jax.config import TrainConfig, load_config
from trace_jax.train.checkpoint import newest_meta, resume_point, run_checkpoints_dir
from trace_jax.train.smoke import smoke_config

pytestmark = pytest.mark.all_devices  # test_train's runs compiled this step on the 8 devices' mesh

TINY_DIMS = [f"sft.model.{k}={v}" for k, v in dataclasses.asdict(TINY_POLICY).items()]  # the "recipe's" dims


def test_smoke_runs_steps_on_random_weights_beside_the_run_which_then_starts_at_step_0(run_dirs, tmp_path,  # noqa: F811
                                                                                       capsys):
    run = tmp_path / "run"
    args = [*OVERRIDES, *TINY_DIMS, f"out_dir={run}", f"data_dir={run_dirs / 'tfds'}",
            f"init_checkpoint={tmp_path / 'no_base_policy'}"]  # random weights: no base policy read or built
    assert main(["train", "--smoke", *args]) == 0
    out = capsys.readouterr().out
    assert "on random weights (sft.model)" in out
    assert len(re.findall(r"smoke: step \d/3: .* generated tokens/s, .*device memory", out)) == 3
    assert re.search(r"smoke: OK: .* s a step after the first .* restored from .*smoke/checkpoints", out)
    assert [p.name for p in run.iterdir()] == ["smoke"]  # nothing in the run's own checkpoints
    smoke = run / "smoke"
    assert newest_meta(smoke / "checkpoints")[0] == 3
    rows = [json.loads(line) for line in (smoke / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # no warm-up or step-0 evaluation
    assert not (smoke / "reliability.jsonl").exists()  # no evaluation
    assert resume_point(load_config(TrainConfig, None, args)) is None  # the real run starts at step 0


def test_smoke_checkpoints_go_beside_a_set_checkpoint_dir(tmp_path):
    cfg = load_config(TrainConfig, None, [f"out_dir={tmp_path / 'run'}", f"checkpoint_dir={tmp_path / 'ckpt'}"])
    smoke = smoke_config(cfg, 3)
    assert str(run_checkpoints_dir(smoke)) == str(tmp_path / "ckpt-smoke")
    assert smoke.out_dir == str(tmp_path / "run" / "smoke") and smoke.warmup.batches == 0 and smoke.steps == 3
    remote = dataclasses.replace(cfg, out_dir="gs://b/run/", checkpoint_dir="")
    assert str(run_checkpoints_dir(smoke_config(remote, 3))) == "gs://b/run/smoke/checkpoints"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_smoke_fails_first_naming_what_to_stage(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    url = f"http://127.0.0.1:{_closed_port()}/retrieve"
    search = ["env=search_qa", f"search_qa.policy_dir={empty}", f"search_qa.qa_dir={empty}",
              "search_qa.train_datasets=[nq]", "search_qa.eval_datasets=[nq,hotpotqa]",
              f"search_qa.retriever.url={url}", f"out_dir={tmp_path / 'run'}"]
    assert main(["train", "--smoke", *search]) == 2
    assert "--preset one of ['qwen3-14b', 'qwen3-8b']" in capsys.readouterr().err  # no config.json, no preset
    assert main(["train", "--smoke", "--preset", "qwen3-8b", *search]) == 2
    err = capsys.readouterr().err
    assert "stage these first" in err and f"search_qa.policy_dir={empty}: the policy's tokenizer" in err
    assert "nq/train.jsonl" in err and "hotpotqa/test.jsonl or hotpotqa/dev.jsonl" in err
    assert f"search_qa.retriever.url={url}: a retriever answering there" in err
    math = ["env=math", f"task.policy_dir={empty}", f"task.problems_dir={empty}", "task.eval_sets=[aime24]",
            f"out_dir={tmp_path / 'run'}"]
    assert main(["train", "--smoke", "--preset", "qwen3-8b", *math]) == 2
    err = capsys.readouterr().err
    assert f"task.policy_dir={empty}: the policy's tokenizer" in err
    assert "train.jsonl" in err and "eval/aime24.jsonl" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # nothing written


def test_smoke_flags_need_smoke_and_smoke_never_resumes(capsys):
    assert main(["train", "--preset", "qwen3-8b"]) == 2
    assert "only apply with --smoke" in capsys.readouterr().err
    assert main(["train", "--smoke", "--resume"]) == 2
    assert "drop --resume" in capsys.readouterr().err
