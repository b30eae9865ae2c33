"""A sandbox worker: a pre-started process that runs programs, each in a freshly forked, locked-down child.

`python -I -m trace_jax.envs.math.sandbox_worker ROOT PRELOAD` reads one JSON request per line on stdin,
{"cells": [source, ...], "cpu_s", "wall_s", "memory_mb", "file_mb", "disk_mb", "output_bytes"}, and answers
one JSON line on stdout, {"status", "output"}. The child (`lockdown.lock_down`) runs the earlier cells
silently, then the last one with its stdout and stderr captured: every cell sees the variables the earlier
cells left. The worker itself never runs model-written code; it kills each child's whole process group when it
ends, times out or writes too much, and deletes its private folder. PRELOAD (comma-separated modules) is
imported once here, so children start warm.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback

from trace_jax.envs.math.lockdown import lock_down

EXIT_OK, EXIT_RAISED, EXIT_MEMORY, EXIT_LOCKDOWN = 0, 251, 252, 253  # what a program exits with by itself: "error"
STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error")


def _short_traceback(exc: BaseException) -> str:
    """The exception's last line and the cell line it came from (the peers' observation of an error)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<cell>"]
    where = f"line {frames[-1].lineno}: " if frames else ""
    return where + "".join(traceback.format_exception_only(type(exc), exc)).strip()


def execute(cells: list[str]) -> int:
    """Runs in the locked-down child: the earlier cells with their output discarded, then the last; an exit code."""
    scope: dict = {"__name__": "__main__"}
    sink = io.StringIO()
    for cell in cells[:-1]:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), contextlib.suppress(Exception,
                                                                                                     SystemExit):
            exec(compile(cell, "<cell>", "exec"), scope)
        sink.seek(0)
        sink.truncate()
    try:
        exec(compile(cells[-1], "<cell>", "exec"), scope)
        code = EXIT_OK
    except SystemExit:
        code = EXIT_OK
    except MemoryError:
        code = EXIT_MEMORY
    except BaseException as exc:
        print(_short_traceback(exc), file=sys.stderr)
        code = EXIT_RAISED
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _child(folder: str, write_fd: int, request: dict) -> None:
    """The forked child: output to the pipe, its own session and folder, locked down; never returns."""
    try:
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.setsid()
        os.environ.clear()
        os.environ.update(HOME=folder, TMPDIR=folder, LANG="C.UTF-8", PYTHONHASHSEED="0")
        tempfile.tempdir = folder
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past file_mb fails with EFBIG instead of killing
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        lock_down(folder, request["cpu_s"], request["memory_mb"], request["file_mb"], request["disk_mb"])
        os.chdir(folder)  # after the tmpfs is mounted on it
    except BaseException as exc:
        os.write(2, f"sandbox error: {exc}".encode())
        os._exit(EXIT_LOCKDOWN)
    os._exit(execute(request["cells"]))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run(request: dict, root: str) -> dict:
    """One program, start to cleanup: {"status": one of STATUSES, "output": its stdout and stderr (capped)}."""
    folder = tempfile.mkdtemp(dir=root)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(folder, write_fd, request)
    os.close(write_fd)
    cap, out, status = request["output_bytes"], bytearray(), None
    deadline = time.monotonic() + request["wall_s"]
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        out += chunk
        if len(out) > cap:
            status = "output_limit"
            break
    _kill_group(pid)
    os.close(read_fd)
    _, wait_status = os.waitpid(pid, 0)
    shutil.rmtree(folder, ignore_errors=True)
    if status is None:
        if os.WIFSIGNALED(wait_status):
            sig = os.WTERMSIG(wait_status)
            status = "timeout" if sig == signal.SIGXCPU else "killed"
            out += f"\n(stopped by {signal.Signals(sig).name})".encode()
        else:
            code = os.WEXITSTATUS(wait_status)
            status = {EXIT_OK: "ok", EXIT_RAISED: "error", EXIT_MEMORY: "memory",
                      EXIT_LOCKDOWN: "sandbox_error"}.get(code, "error")
            if status == "error" and code != EXIT_RAISED:
                out += f"\n(exited with code {code})".encode()
    return {"status": status, "output": out[:cap].decode("utf-8", "replace")}


def main(argv: list[str]) -> None:
    root, preload = argv[0], [m for m in argv[1].split(",") if m] if len(argv) > 1 else []
    for module in preload:
        importlib.import_module(module)
    channel = sys.stdout
    for line in sys.stdin:
        reply = run(json.loads(line), root)
        channel.write(json.dumps(reply) + "\n")
        channel.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
