"""A run whose out_dir is remote (gs://bucket/run): written to a local working copy that is mirrored there, and
continued from the remote on a fresh machine. A plain local folder stands in for the bucket."""

import json
import sys
from pathlib import Path

import pytest
from etils import epath
from test_train import _metrics, config, full_run, no_plots, run_dirs  # noqa: F401 (fixtures)

from trace_jax.cli import main
from trace_jax.train import run_dir
from trace_jax.train.checkpoint import newest_meta
from trace_jax.train.loop import train
from trace_jax.train.run_dir import RunDir, working_copy

pytestmark = pytest.mark.all_devices  # the runs below continue test_train's full_run (8 devices), exactly


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


@pytest.fixture
def bucket(tmp_path, monkeypatch) -> Path:
    """A folder standing in for gs://bucket: out_dirs under it are remote."""
    root = tmp_path / "bucket"
    monkeypatch.setattr(run_dir, "is_remote", lambda path: path.startswith(str(root)))
    return root


def test_push_copies_what_changed_and_a_resumed_run_pulls_the_remote_logs_alone(tmp_path):
    remote = tmp_path / "bucket" / "run"
    vm1 = RunDir(tmp_path / "vm1", epath.Path(remote))
    vm1.pull(resume=True)  # nothing there yet: an empty working copy
    (vm1.local / "tensorboard").mkdir()
    (vm1.local / "tensorboard" / "events.0").write_bytes(b"e")
    (vm1.local / "metrics.jsonl").write_text("0\n")
    vm1.push()
    assert files(remote) == files(vm1.local)
    (remote / "tensorboard" / "events.0").write_bytes(b"marked")  # unchanged in the working copy: not sent again
    with (vm1.local / "metrics.jsonl").open("a") as f:
        f.write("1\n")
    vm1.push()
    assert files(remote) == {"metrics.jsonl": b"0\n1\n", "tensorboard/events.0": b"marked"}

    (remote / "checkpoints" / "1").mkdir(parents=True)  # orbax's, and the final policy: not logs
    (remote / "policy").mkdir()
    (remote / "policy" / "weights").write_bytes(b"w")
    vm2 = RunDir(tmp_path / "vm2", epath.Path(remote))
    vm2.local.mkdir()
    (vm2.local / "stale.jsonl").write_text("an older run's\n")
    vm2.pull(resume=True)
    assert files(vm2.local) == {"metrics.jsonl": b"0\n1\n", "tensorboard/events.0": b"marked"}
    (remote / "metrics.jsonl").write_text("marked\n")
    vm2.push()  # nothing changed since the pull
    assert (remote / "metrics.jsonl").read_text() == "marked\n"

    # a new run there (killed before its first checkpoint, say): its rows replace the remote's, none twice
    vm2.pull(resume=False)
    assert files(vm2.local) == {}
    (vm2.local / "metrics.jsonl").write_text("0\n")
    vm2.push()
    assert (remote / "metrics.jsonl").read_text() == "0\n"


def test_a_failed_copy_is_raised_or_left_to_the_next_push(tmp_path, monkeypatch, capsys):
    remote = tmp_path / "bucket" / "run"
    run = RunDir(tmp_path / "vm", epath.Path(remote))
    run.pull(resume=False)
    (run.local / "metrics.jsonl").write_text("0\n")
    copy = run_dir._copy

    def unreachable(src, dst):
        raise OSError("503 Service Unavailable")

    monkeypatch.setattr(run_dir, "_copy", unreachable)
    with pytest.raises(OSError, match="503"):
        run.push()  # at the start and the end of a run, and in a smoke check
    run.push(retry_later=True)  # after a step
    assert "copying metrics.jsonl to" in capsys.readouterr().err and not remote.exists()
    monkeypatch.setattr(run_dir, "_copy", copy)
    run.push(retry_later=True)
    assert (remote / "metrics.jsonl").read_text() == "0\n"


def test_the_working_copy_is_keyed_by_the_remote_path_and_a_local_out_dir_is_written_in_place(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert working_copy("gs://b/runs/a/") == tmp_path / "trace-jax" / "runs" / "gs" / "b" / "runs" / "a"
    assert RunDir.of("runs/a") == RunDir(Path("runs/a"))


def test_gs_out_dir_without_gcsfs_fails_first_thing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # not installed
    monkeypatch.chdir(tmp_path)
    for args in (["out_dir=gs://b/run"], ["checkpoint_dir=gs://b/ckpt"], ["--smoke", "out_dir=gs://b/run"]):
        assert main(["train", *args]) == 2
        assert "pip install 'trace-jax[gcs]'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no dataset, base policy or run files


class Killed(Exception):
    pass


def test_a_remote_run_is_mirrored_and_continues_on_a_fresh_machine(run_dirs, full_run, bucket, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    no_plots(monkeypatch)
    remote = bucket / "run"
    cfg = config(run_dirs, "steps=5", "checkpoint_every=2", f"out_dir={remote}")  # full_run's, but for checkpoints

    def dies_at_step_4(step: int, row: dict) -> None:  # the machine dies once step 4 is logged, before its mirror
        if step == 4:
            raise Killed

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "vm1"))
    with pytest.raises(Killed):
        train(cfg, on_log=dies_at_step_4)
    assert steps(working_copy(str(remote)) / "metrics.jsonl") == [0, 1, 2, 3, 4]
    assert steps(remote / "metrics.jsonl") == [0, 1, 2, 3]
    assert newest_meta(remote / "checkpoints")[0] == 2  # orbax writes to the remote itself

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "vm2"))  # a fresh machine: an empty working copy
    train(cfg)
    local = working_copy(str(remote))
    assert steps(remote / "metrics.jsonl") == [0, 1, 2, 3, 4, 5]  # none lost, none twice
    assert steps(remote / "allocation.jsonl") == [1, 2, 3, 4, 5]
    assert _metrics(remote) == _metrics(full_run)  # continued exactly
    mirrored = files(remote)
    assert {k: v for k, v in mirrored.items() if not k.startswith("checkpoints/")} == files(local)
    assert {"config.yaml", "metrics.jsonl", "policy/5/_CHECKPOINT_METADATA"} <= set(mirrored)  # the final policy
    assert len([k for k in mirrored if k.startswith("tensorboard/events")]) == 2  # vm1's, continued by vm2's
