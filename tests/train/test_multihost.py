"""Two processes joined through jax.distributed (4 CPU devices each) against one process with 8: the same global
pool from per-process rows, one stop decision, and the same training metrics."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from host_tree import expand_on_host_mesh
from processes import assert_rows_close, float32_tolerance, logged_rows, two_processes
from test_train import OVERRIDES, run_dirs  # noqa: F401 (run_dirs: the shared base policy and dataset fixture)

from trace_jax.config import TrainConfig, load_config
from trace_jax.data.loader import hopworld_loader
from trace_jax.train.loop import train

pytestmark = pytest.mark.all_devices  # one process with all 8 devices is the reference

HERE = Path(__file__).parent
# pool_size=8 on 8 devices: one row per device, so each process holds (and loads) half of every pool
TWO_STEPS = [*OVERRIDES, "pool_size=8", "roots=8", "steps=2", "warmup.batches=0"]


def test_each_process_loads_its_half_of_the_global_pool(run_dirs):  # noqa: F811
    paths = [f"init_checkpoint={run_dirs / 'base'}", f"data_dir={run_dirs / 'tfds'}"]
    runs = two_processes(lambda port, i: [sys.executable, str(HERE / "two_process_pool.py"), str(port), str(i),
                                           *TWO_STEPS, *paths], timeout=120)
    got = [json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{"))) for r in runs]
    assert [g["rows"] for g in got] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    cfg = load_config(TrainConfig, None, [*TWO_STEPS, *paths])
    expected = hopworld_loader(cfg.data_dir, cfg.world, "train", cfg.pool_size, cfg.seed).batch(3)
    for g in got:  # the pool one process with all devices would see
        np.testing.assert_array_equal(g["question"], expected["question_id"])
        np.testing.assert_array_equal(g["tokens"], expected["prompt_ids"])
    assert [g["stop"] for g in got] == [True, True]  # process 1's stop request reaches process 0


@pytest.mark.slow  # ~5 min on 2 CPU cores: 2 + 1 processes compiling the warm-up, the step and evaluation
def test_two_processes_train_like_one_process_with_all_devices_through_a_preemption(run_dirs, tmp_path):  # noqa: F811
    """Two processes warm the predictor up and train 3 steps; SIGTERM reaches process 1 alone during step 2, yet
    both stop after the same step, checkpointed (exit 143), and --resume finishes the run. Its metrics equal one
    process's with 8 devices."""
    args = [*TWO_STEPS, "steps=3", "checkpoint_every=1", "warmup.batches=1", f"init_checkpoint={run_dirs / 'base'}",
            f"data_dir={run_dirs / 'tfds'}"]
    two, one = tmp_path / "two", tmp_path / "one"
    train_cmd = lambda *flags: lambda port, i: [
        sys.executable, "-m", "trace_jax.cli", "train", "--coordinator", f"localhost:{port}", "--num-processes", "2",
        "--process-id", str(i), *flags, *args, f"out_dir={two}"]
    runs = two_processes(train_cmd(), timeout=600, codes=(143, 143),
                          signal_process_1=lambda: (two / "checkpoints" / "1" / "meta").exists())
    # gloo's C++ threads log their connections to stdout, interleaved (lines split, blank lines): ours is the rest
    printed = [[line for line in r.stdout.splitlines() if line.strip() and not re.search(r"\[Gloo\]|peer ranks", line)]
               for r in runs]
    assert any(line.startswith("train: trace, pool B=8") for line in printed[0]) and printed[1] == []  # process 0's
    stopped = [int(re.search(r"preempted \(SIGTERM\) after step (\d+)", r.stderr).group(1)) for r in runs]
    assert stopped == [2, 2]
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["1", "2"]
    two_processes(train_cmd("--resume"), timeout=600)
    train(load_config(TrainConfig, None, [*args, f"out_dir={one}"]))  # 8 devices, this process

    a, b = logged_rows(one / "metrics.jsonl"), logged_rows(two / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3]
    # float32 reductions in another order: equal to ~1e-7 relative. A spread (std) of values near their mean m loses
    # m^2 / var digits to cancellation: pool V~ near 0.5 with a std of ~0.013 turns float32's 6e-8 into ~5e-5
    # relative (3e-5 measured at step 3). An evaluation after updates reads parameters that Adam moved by up to lr
    # on a gradient that is float32 noise (a weight the loss leaves at ~0): the two runs' V~ part by ~1e-5, their
    # test Brier score by 1.6e-4 relative at step 3 (a process missing a shard or training on other rows would be off
    # by far more)
    # ratio_max_dev: 4.8e-7 against 9.5e-7 in one run (`float32_tolerance`)
    assert_rows_close(a, b, lambda key: (1e-3, 1e-7) if key.startswith("eval/") else float32_tolerance(key))
    # prompt-level values: a process training on other rows than its own changes them, V~ by far more than the
    # ~1e-5 of Adam's float32 noise, and the budgets
    assert_rows_close(logged_rows(one / "allocation.jsonl"), logged_rows(two / "allocation.jsonl"),
                      lambda key: (0.0, 1e-4))


def test_two_processes_answer_their_own_slots_on_the_host_path(tmp_path):
    """The host path (search QA's) over 2 processes x 4 devices: each process's environment answers only its
    slots, and the tree is the one a process with all 8 devices expands."""
    out = [tmp_path / f"tree{i}.json" for i in range(2)]
    two_processes(lambda port, i: [sys.executable, str(HERE / "two_process_host.py"), str(port), str(i), str(out[i])],
                   timeout=300)
    got = [json.loads(path.read_text()) for path in out]
    tree, calls = expand_on_host_mesh()
    for g in got:
        for key, value in vars(tree).items():
            np.testing.assert_allclose(np.asarray(g[key]), np.asarray(value), atol=1e-5, err_msg=key)
    # each process answered the live slots of its 4 devices' rows: together, what one process answered
    assert len(got[0]["calls"]) == len(got[1]["calls"]) == len(calls)
    np.testing.assert_array_equal(np.add(got[0]["calls"], got[1]["calls"]), calls)
    assert 0 < sum(got[0]["calls"]) < sum(calls) and 0 < sum(got[1]["calls"]) < sum(calls)
