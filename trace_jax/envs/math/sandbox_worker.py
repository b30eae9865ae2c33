"""A sandbox worker: a pre-started process that runs programs, each in a freshly forked, locked-down child.

`python -I -m trace_jax.envs.math.sandbox_worker ROOT PRELOAD DISK_MB` reads one JSON request per line on stdin,
{"cells": [source, ...], "cpu_s", "wall_s", "memory_mb", "file_mb", "output_bytes"}, and answers one JSON line
on stdout, {"status", "output"}. Each child is forked ahead of its program, right after the previous answer is
sent (a standby, its folder already a private tmpfs: `lockdown.enclose`), so no caller waits for a fork. On its
request it locks itself down (`lockdown.confine`), runs the earlier cells silently, then the last one with its
stdout and stderr captured: every cell sees the variables the earlier cells left. The worker itself never runs
model-written code; it kills each child's whole process group when it ends, times out or writes too much, and
deletes its folder. PRELOAD (comma-separated modules) is imported and warmed up once here, so children start warm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
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

from trace_jax.envs.math.lockdown import confine, enclose, readable_roots

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


@dataclasses.dataclass
class Standby:
    """A forked child waiting for its program: its pid, its folder and its three pipes."""

    pid: int
    folder: str
    request_fd: int  # the worker writes the request here, then closes it (-1 once closed)
    output_fd: int  # the child's stdout and stderr
    status_fd: int  # one byte, the exit code `execute` returned, written before the child closes its output
    reaped: bool = False


def _child(folder: str, request_fd: int, output_fd: int, status_fd: int, disk_mb: int) -> None:
    """The forked child: output to the pipe, its own session and tmpfs; then its request, locked down; never
    returns. Its status byte and the end of its output come before its exit, whose teardown (a copy-on-write
    image of the warm worker) the worker's answer does not wait for."""
    try:
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        os.close(output_fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.setsid()
        os.environ.clear()
        os.environ.update(HOME=folder, TMPDIR=folder, LANG="C.UTF-8", PYTHONHASHSEED="0")
        tempfile.tempdir = folder
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past file_mb fails with EFBIG instead of killing
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        mapped = enclose(folder, disk_mb)
        with os.fdopen(request_fd, "rb") as f:
            request = json.loads(f.read())
        confine(mapped, request["cpu_s"], request["memory_mb"], request["file_mb"])
        os.chdir(folder)  # after the tmpfs is mounted on it
    except BaseException as exc:
        os.write(2, f"sandbox error: {exc}".encode())
        os._exit(EXIT_LOCKDOWN)
    code = execute(request["cells"])
    os.write(status_fd, bytes([code]))
    os.close(1)
    os.close(2)
    os._exit(code)


def spawn(root: str, disk_mb: int) -> Standby:
    """The next child, forked now and waiting for its request."""
    folder = tempfile.mkdtemp(dir=root)
    request_r, request_w = os.pipe()
    output_r, output_w = os.pipe()
    status_r, status_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        for fd in (request_w, output_r, status_r):
            os.close(fd)
        _child(folder, request_r, output_w, status_w, disk_mb)
    for fd in (request_r, output_w, status_w):
        os.close(fd)
    return Standby(pid, folder, request_w, output_r, status_r)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def reap(child: Standby) -> int:
    """Kills what is left of child's process group and waits for it; its wait status."""
    _kill_group(child.pid)
    _, wait_status = os.waitpid(child.pid, 0)
    child.reaped = True
    return wait_status


def finish(child: Standby) -> None:
    """The child reaped, its pipes closed, its folder removed."""
    if not child.reaped:
        reap(child)
    if child.request_fd >= 0:  # never sent a request (the worker is closing)
        os.close(child.request_fd)
    os.close(child.output_fd)
    os.close(child.status_fd)
    shutil.rmtree(child.folder, ignore_errors=True)


def run(request: dict, child: Standby) -> dict:
    """One program on the waiting child: {"status": one of STATUSES, "output": its stdout and stderr (capped)}."""
    deadline = time.monotonic() + request["wall_s"]
    with contextlib.suppress(OSError):  # a child that died before reading: EPIPE
        os.write(child.request_fd, json.dumps(request).encode())
    os.close(child.request_fd)
    child.request_fd = -1  # closed: its number may name the next child's pipe
    cap, out, status = request["output_bytes"], bytearray(), None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        ready, _, _ = select.select([child.output_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(child.output_fd, 65536)
        if not chunk:
            break
        out += chunk
        if len(out) > cap:
            status = "output_limit"
            break
    if status is not None:  # stopped: timeout or output limit
        reap(child)
        return {"status": status, "output": out[:cap].decode("utf-8", "replace")}
    ready, _, _ = select.select([child.status_fd], [], [], max(deadline - time.monotonic(), 0))
    if not ready:  # its output closed, the program still running
        reap(child)
        return {"status": "timeout", "output": out[:cap].decode("utf-8", "replace")}
    written = os.read(child.status_fd, 1)  # empty when the program ended the process itself, or a signal did
    if written:
        code = written[0]
    else:
        wait_status = reap(child)
        if os.WIFSIGNALED(wait_status):
            sig = os.WTERMSIG(wait_status)
            out += f"\n(stopped by {signal.Signals(sig).name})".encode()
            return {"status": "timeout" if sig == signal.SIGXCPU else "killed",
                    "output": out[:cap].decode("utf-8", "replace")}
        code = os.WEXITSTATUS(wait_status)
    status = {EXIT_OK: "ok", EXIT_RAISED: "error", EXIT_MEMORY: "memory", EXIT_LOCKDOWN: "sandbox_error"}.get(
        code, "error")
    if status == "error" and code != EXIT_RAISED:
        out += f"\n(exited with code {code})".encode()
    return {"status": status, "output": out[:cap].decode("utf-8", "replace")}


WARM_UP = {  # what a preloaded module imports lazily on first use, done once here so that no child pays for it
    "sympy": "x, y = sympy.symbols('x y')\nsympy.solve([x + y - 3, x - y - 1], [x, y])\nsympy.factorint(360)\n"
             "sympy.simplify(sympy.sin(x) ** 2 + sympy.cos(x) ** 2)\nsympy.summation(x ** 2, (x, 1, 5))\n"
             "sympy.nsimplify(0.5)\nsympy.Rational(1, 3) + 1\nsympy.latex(x / 2)",
    "numpy": "numpy.linalg.solve([[2.0, 1.0], [1.0, 3.0]], [3.0, 5.0])",
}


def main(argv: list[str]) -> None:
    root, preload = argv[0], [m for m in argv[1].split(",") if m] if len(argv) > 1 else []
    for module in preload:
        exec(WARM_UP.get(module, ""), {module: importlib.import_module(module)})
    readable_roots()  # computed once, inherited by every child
    gc.freeze()  # the warm objects stay out of the collector: children do not touch (copy) their pages for it
    disk_mb = int(argv[2]) if len(argv) > 2 else 64
    channel = sys.stdout
    child = spawn(root, disk_mb)
    try:
        for line in sys.stdin:
            reply = run(json.loads(line), child)
            channel.write(json.dumps(reply) + "\n")
            channel.flush()
            finish(child)  # its exit and cleanup, and the next fork, after the answer is out
            child = spawn(root, disk_mb)
    finally:
        finish(child)


if __name__ == "__main__":
    main(sys.argv[1:])
