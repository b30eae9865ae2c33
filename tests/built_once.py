"""Expensive session fixtures that pytest-xdist's workers build once between them: the first worker to ask
builds under a file lock, the others wait for it and reuse the folder."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's tmp folder, the same in every worker (each worker's own tmp is a folder of it)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if "PYTEST_XDIST_WORKER" in os.environ else root


def built_once(root: Path, name: str, build: Callable[[Path], object]) -> Path:
    """root/<name>, made by build(path) in exactly one process of this test session (root: a folder every worker
    sees, `session_tmp` or the session's shared folder of tests/conftest.py)."""
    path = root / name
    with FileLock(f"{path}.lock"):
        if not (root / f"{name}.done").exists():
            shutil.rmtree(path, ignore_errors=True)  # a build that failed midway
            path.mkdir()
            build(path)
            (root / f"{name}.done").touch()
    return path
