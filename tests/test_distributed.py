"""Joining processes: the arguments are checked before anything starts, a lone process joins nothing; gs:// checkpoint
directories reach orbax unchanged (the two-process runs themselves: tests/train/test_multihost.py)."""

import os
import subprocess
import sys

import pytest

from trace_jax.checkpoints import checkpoint_path
from trace_jax.cli import main
from trace_jax.config import TrainConfig, load_config
from trace_jax.distributed import Cluster, any_process, is_main, join, main_first
from trace_jax.train.checkpoint import run_checkpoints_dir


@pytest.mark.parametrize("kwargs, message", [
    ({"coordinator": "h:1"}, "--coordinator given without --num-processes, --process-id"),
    ({"num_processes": 2, "process_id": 0}, "without --coordinator"),
    ({"coordinator": "h:1", "num_processes": 2, "process_id": 0, "auto": True}, "--multi-host detects the cluster"),
    ({"coordinator": "h", "num_processes": 2, "process_id": 0}, "must be HOST:PORT"),
    ({"coordinator": "h:70000", "num_processes": 2, "process_id": 0}, "must be HOST:PORT"),
    ({"coordinator": "h:1", "num_processes": 0, "process_id": 0}, "--num-processes must be >= 1"),
    ({"coordinator": "h:1", "num_processes": 2, "process_id": 2}, r"--process-id must be in \[0, 2\)"),
])
def test_inconsistent_cluster_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Cluster(**kwargs)


def test_train_refuses_partial_arguments_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--coordinator", "localhost:1234", "--process-id", "0"]) == 2
    assert "without --num-processes" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_multi_host_outside_a_cluster_says_what_it_detects(tmp_path):
    result = subprocess.run([sys.executable, "-m", "trace_jax.cli", "train", "--multi-host", f"out_dir={tmp_path}"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "XLA_FLAGS": ""})
    assert result.returncode == 2 and "--multi-host found no cluster to join" in result.stderr
    assert "--coordinator" in result.stderr and list(tmp_path.iterdir()) == []


def test_a_lone_process_joins_nothing_and_is_process_zero():
    join(Cluster())  # nothing to do (initialising would fail here: JAX is in use in this process)
    assert not Cluster().joins and Cluster(auto=True).joins
    assert is_main() and any_process(True) and not any_process(False)
    assert main_first("x", lambda: 7) == 7


def test_gs_checkpoint_dirs_reach_orbax_unchanged():
    path = checkpoint_path("gs://bucket/runs/a/checkpoints")
    assert os.fspath(path) == "gs://bucket/runs/a/checkpoints" and path.name == "checkpoints"
    assert os.fspath(path / "7") == "gs://bucket/runs/a/checkpoints/7"
    cfg = load_config(TrainConfig, None, ["checkpoint_dir=gs://bucket/ckpt", "out_dir=runs/a"])
    assert os.fspath(run_checkpoints_dir(cfg)) == "gs://bucket/ckpt"
    local = run_checkpoints_dir(load_config(TrainConfig, None, ["out_dir=runs/a"]))
    assert os.fspath(local) == os.path.abspath("runs/a/checkpoints")


def test_run_checkpoints_hand_orbax_the_gs_path(monkeypatch):
    import orbax.checkpoint as ocp

    from trace_jax.train.checkpoint import RunCheckpoints

    seen = []  # orbax's manager would reach the bucket; record the directory it is given instead
    monkeypatch.setattr(ocp, "CheckpointManager", lambda directory, **kwargs: seen.append(directory))
    RunCheckpoints("gs://bucket/ckpt", keep=2)
    assert [os.fspath(d) for d in seen] == ["gs://bucket/ckpt"]
