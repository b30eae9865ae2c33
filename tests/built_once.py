"""Expensive session fixtures that pytest-xdist's workers build once between them: the first worker to ask
builds under a file lock, the others wait for it and reuse the folder."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """<session tmp>/<name>, made by build(path) in exactly one process of this test session."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:  # each worker's tmp is a folder of the session's
        root = root.parent
    path = root / name
    with FileLock(f"{path}.lock"):
        if not (root / f"{name}.done").exists():
            shutil.rmtree(path, ignore_errors=True)  # a build that failed midway
            path.mkdir()
            build(path)
            (root / f"{name}.done").touch()
    return path
