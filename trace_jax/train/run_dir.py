"""A run's out_dir on Google Cloud Storage (gs://bucket/run, or another etils.epath URL): the run writes its files
(metrics, TensorBoard, plots, evaluations, config.yaml, the final policy) to a local working copy and mirrors what
changed to the remote after each logged step and at the end; a run that resumes elsewhere (the same command on a
fresh VM) first copies the remote's logs down, so they continue. Its checkpoints go to the remote directly (orbax).
A local out_dir is written in place."""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import sys
from pathlib import Path

from etils import epath

from trace_jax.metrics import TENSORBOARD_DIR

GCS_EXTRA = "install the gcs extra: pip install 'trace-jax[gcs]'"


def is_remote(path: str) -> bool:
    """A URL (gs://bucket/run) rather than a local path."""
    return "://" in path


def check_storage(*paths: str) -> None:
    """Fails naming the package to install when a gs:// path among `paths` has no gcsfs to reach it."""
    gcs = [p for p in paths if p.startswith("gs://")]
    if not gcs:
        return
    try:
        importlib.import_module("gcsfs")
    except ImportError:
        raise ValueError(f"{gcs[0]} is on Google Cloud Storage, which this environment cannot reach without gcsfs: "
                         f"{GCS_EXTRA}") from None


def working_copy(remote: str) -> Path:
    """The local working copy of the remote run directory `remote`: <cache>/trace-jax/runs/<scheme>/<path>, under
    $XDG_CACHE_HOME (default ~/.cache)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "trace-jax" / "runs" / remote.replace("://", "/", 1).strip("/")


@dataclasses.dataclass
class RunDir:
    """Where a run writes its files (`local`), and the remote directory that mirrors them (None: local is the run's
    out_dir)."""

    local: Path
    remote: epath.Path | None = None
    _pushed: dict[str, tuple[int, int, int]] = dataclasses.field(default_factory=dict, init=False, repr=False)
    # each file of the working copy as last pushed or pulled: its path there -> (inode, size, mtime)

    @classmethod
    def of(cls, out_dir: str) -> RunDir:
        """out_dir's: written in place, or (a URL) through its working copy; fails first thing without gcsfs for
        gs://."""
        if not is_remote(out_dir):
            return cls(Path(out_dir))
        check_storage(out_dir)
        return cls(working_copy(out_dir), epath.Path(out_dir))

    def pull(self, resume: bool) -> None:
        """Readies the working copy (a stale one is dropped): for a run that resumes, the remote's logs, its
        top-level files and tensorboard/ (not its checkpoints, final policy or other subfolders); for a new run,
        nothing (its files replace the remote's as they are pushed)."""
        if self.remote is None:
            return
        shutil.rmtree(self.local, ignore_errors=True)
        self.local.mkdir(parents=True)
        folders = (self.remote, self.remote / TENSORBOARD_DIR) if resume else ()  # the run's logs: no other subfolder
        for src in (p for folder in folders if folder.is_dir() for p in folder.iterdir() if p.is_file()):
            _copy(src, epath.Path(self.local / str(src.relative_to(self.remote))))
        self._pushed = self._stats()

    def push(self, retry_later: bool = False) -> None:
        """Copies the files of the working copy that changed since the last push (or pull) to the remote.
        retry_later: a failed copy is reported and left to the next push (a step's mirror does not stop a long run
        over a network error), else raised."""
        if self.remote is None:
            return
        for name, stat in self._stats().items():
            if self._pushed.get(name) == stat:
                continue
            try:
                _copy(epath.Path(self.local / name), self.remote / name)
            except Exception as e:  # whatever the storage's client raises (gcsfs: HttpError, OSError, ...)
                if not retry_later:
                    raise
                print(f"run_dir: copying {name} to {self.remote} failed ({type(e).__name__}: {e}); the next push "
                      "retries", file=sys.stderr)
                return
            self._pushed[name] = stat

    def _stats(self) -> dict[str, tuple[int, int, int]]:
        stats = {}
        for path in self.local.rglob("*"):
            if path.is_file():
                s = path.stat()
                stats[path.relative_to(self.local).as_posix()] = (s.st_ino, s.st_size, s.st_mtime_ns)
        return stats


def _copy(src: epath.Path, dst: epath.Path) -> None:
    """Streams src to dst, across storages (a whole object at once on GCS: a reader never sees half a file there)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as f, dst.open("wb") as g:
        shutil.copyfileobj(f, g, 1 << 24)
