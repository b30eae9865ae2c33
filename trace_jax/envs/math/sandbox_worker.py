"""A sandbox worker: a pre-started process that runs programs, each in a freshly forked, locked-down process.

`python -m trace_jax.envs.math.sandbox_worker ROOT PRELOAD DISK_MB [LANDLOCK_ABI]` reads one JSON request per line on
stdin, {"cells": [source, ...], "cpu_s", "wall_s", "memory_mb", "file_mb", "output_bytes"} and, for a replay checked
against what the earlier cells printed, "expected" and "clocks" (per earlier cell) and "replay_s" (seconds added to
both limits for replaying them), and answers one JSON line on stdout, {"status", "output", "seconds", "clock",
"diverged"}. Each program's processes are forked ahead of it, right after the previous answer is sent, so no caller
waits for a fork: a standby (its own namespaces, a private tmpfs on its folder, no capabilities, Landlock:
`lockdown.enclose`), and the program's process it forks at once, which waits for its request. On the request that
process locks itself down (`lockdown.confine`), runs the earlier cells silently, then the last one with its stdout and
stderr captured: every cell sees the variables the earlier cells left. A program starts from one state on every worker
(`random` and numpy's global generator seeded, hash seed 0), and the time module's clocks replay in each earlier cell
the readings that cell took when it ran (`Clock`), so a replay reproduces what the model saw; what it prints is
checked against what it printed then, and the first cell that prints otherwise is reported ("diverged"). It holds no
descriptor but its output, its record's write end and (until read) its request. The standby, which runs no model-
written code, waits for it and reports its wait status on a pipe of its own: a program cannot forge how it ended. The
worker kills each program's whole process group when it ends, times out or writes too much, and deletes its folder.
PRELOAD (comma-separated modules) is imported and warmed up once here, so programs start warm. LANDLOCK_ABI > 0 caps
the Landlock ABI used (an older kernel's path, for tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import io
import json
import math
import os
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

from trace_jax.envs.math.lockdown import become_subreaper, confine, enclose, readable_roots

EXIT_OK, EXIT_RAISED, EXIT_MEMORY, EXIT_LOCKDOWN = 0, 251, 252, 253  # what a program exits with by itself: "error"
STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error")


def _short_traceback(exc: BaseException) -> str:
    """The exception's last line and the cell line it came from (the peers' observation of an error)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<cell>"]
    where = f"line {frames[-1].lineno}: " if frames else ""
    return where + "".join(traceback.format_exception_only(type(exc), exc)).strip()


CLOCKS = ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "process_time",
          "process_time_ns")
MAX_READINGS = 1024  # clock readings recorded per cell; a cell taking more replays the rest from the real clocks
RECORD_BYTES = 1 << 16  # the record a program sends back (its readings, its divergence) is read up to this size
NO_RECORD = {"clock": [], "diverged": -1}  # the record of a program that did not end by itself, or sent junk


class Clock:
    """The time module's clocks in the program's process: each earlier cell reads back, in order, the readings it
    took when it ran; the last cell reads the real clocks, and its readings are recorded (at most MAX_READINGS)."""

    def __init__(self) -> None:
        self.real = {name: getattr(time, name) for name in CLOCKS}
        self.queue: list[float] = []
        self.recorded: list[float] = []
        for name in CLOCKS:
            setattr(time, name, self._reader(name))

    def _reader(self, name: str) -> Callable[[], float]:
        cast = int if name.endswith("_ns") else float

        def read() -> float:
            if self.queue:
                return cast(self.queue.pop(0))
            value = self.real[name]()
            if len(self.recorded) < MAX_READINGS:
                self.recorded.append(value)
            return value

        read.__name__ = name
        return read


def _seed() -> None:
    """One starting state on every worker: the preloaded modules' global generators seeded alike."""
    import random

    random.seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)


def _as_printed(text: str, cap: int) -> str:
    """A replayed cell's output as the worker would have answered it: UTF-8 (bad characters replaced), capped."""
    return text.encode("utf-8", "replace")[:cap].decode("utf-8", "replace")


def execute(cells: list[str], expected: list[str] | None, clocks: list[list[float]] | None, output_bytes: int,
            record_fd: int) -> int:
    """Runs in the locked-down child: the earlier cells with their output kept aside (checked against `expected`,
    their clock readings replayed from `clocks`), then the last; an exit code. The record (the last cell's clock
    readings and the first earlier cell whose output differs from `expected`, or -1) goes to record_fd."""
    _seed()
    clock = Clock()
    scope: dict = {"__name__": "__main__"}
    sink = io.StringIO()
    diverged = -1
    for i, cell in enumerate(cells[:-1]):
        clock.queue = list(clocks[i]) if clocks and i < len(clocks) else []
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            try:
                exec(compile(cell, "<cell>", "exec"), scope)
            except SystemExit:
                pass
            except Exception as exc:  # as the cell's own run printed it
                print(_short_traceback(exc), file=sys.stderr)
        if expected is not None and diverged < 0 and (
                i >= len(expected) or _as_printed(sink.getvalue(), output_bytes) != expected[i]):
            diverged = i
        sink.seek(0)
        sink.truncate()
    clock.queue, clock.recorded = [], []
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
    with contextlib.suppress(OSError):
        os.write(record_fd, json.dumps({"clock": clock.recorded, "diverged": diverged}).encode())
    return code


@dataclasses.dataclass
class Standby:
    """A forked standby waiting for its program: its pid (its process group's), its folder and its three pipes."""

    pid: int
    folder: str
    request_fd: int  # the worker writes the request here, then closes it (-1 once closed)
    output_fd: int  # the program's stdout and stderr
    record_fd: int  # the program's record (`execute`), read once it has ended
    status_fd: int  # the program's wait status (4 bytes), written by the standby once it has reaped the program
    reaped: bool = False


def close_descriptors(keep: set[int]) -> None:
    """Closes every open descriptor of this process but those in keep."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(int(name))


def _program(parent: int, folder: str, request_fd: int, record_fd: int, mapped: int) -> None:
    """The program's process: reads its request, locks itself down, runs it; never returns. Its exit status is
    what `execute` returned; its output ends with it."""
    try:
        with os.fdopen(request_fd, "rb") as f:
            request = json.loads(f.read())
        cpu_s = request["cpu_s"] + math.ceil(request.get("replay_s", 0.0))
        confine(parent, mapped, cpu_s, request["memory_mb"], request["file_mb"])
        os.chdir(folder)  # after the tmpfs is mounted on it
    except BaseException as exc:
        os.write(2, f"sandbox error: {exc}".encode())
        os._exit(EXIT_LOCKDOWN)
    os._exit(execute(request["cells"], request.get("expected"), request.get("clocks"), request["output_bytes"],
                     record_fd))


def _standby(folder: str, request_fd: int, output_fd: int, record_fd: int, status_fd: int, disk_mb: int,
             max_abi: int) -> None:
    """The forked standby: output to the pipe, no other descriptor, its own session, namespaces and tmpfs; forks
    the program's process, then reaps it and writes its wait status; never returns. Its own exit (the teardown of
    its namespaces) comes after the status, which the worker's answer does not wait for."""
    try:
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        close_descriptors({0, 1, 2, request_fd, record_fd, status_fd})
        os.setsid()
        os.environ.clear()
        os.environ.update(HOME=folder, TMPDIR=folder, LANG="C.UTF-8", PYTHONHASHSEED="0")
        tempfile.tempdir = folder
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past file_mb fails with EFBIG instead of killing
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        mapped = enclose(folder, disk_mb, max_abi)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(status_fd)
            _program(parent, folder, request_fd, record_fd, mapped)
        for fd in (request_fd, record_fd, 1, 2):  # the program's output and record end when the program does
            os.close(fd)
        _, wait_status = os.waitpid(pid, 0)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox error: {exc}".encode())
        os._exit(EXIT_LOCKDOWN)
    os.write(status_fd, struct.pack("i", wait_status))
    os._exit(0)


def spawn(root: str, disk_mb: int, max_abi: int = 0) -> Standby:
    """The next standby, forked now, its program's process waiting for the request."""
    folder = tempfile.mkdtemp(dir=root)
    request_r, request_w = os.pipe()
    output_r, output_w = os.pipe()
    record_r, record_w = os.pipe()
    status_r, status_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _standby(folder, request_r, output_w, record_w, status_w, disk_mb, max_abi)
    for fd in (request_r, output_w, record_w, status_w):
        os.close(fd)
    return Standby(pid, folder, request_w, output_r, record_r, status_r)


def reap(child: Standby) -> int:
    """Kills what is left of the standby's process group and waits for the standby; its wait status. A program's
    process orphaned by its standby's death is the worker's (a subreaper): it is reaped here too, now or next time."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    _, wait_status = os.waitpid(child.pid, 0)
    child.reaped = True
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return wait_status


def finish(child: Standby) -> None:
    """The standby reaped, its pipes closed, its folder removed."""
    if not child.reaped:
        reap(child)
    if child.request_fd >= 0:  # never sent a request (the worker is closing)
        os.close(child.request_fd)
    os.close(child.output_fd)
    os.close(child.record_fd)
    os.close(child.status_fd)
    shutil.rmtree(child.folder, ignore_errors=True)


def _record(child: Standby, replayed: int) -> dict:
    """What the ended program sent on its record pipe: {"clock": its last cell's readings, "diverged": the first
    of its `replayed` earlier cells whose replay printed otherwise, or -1}. The program wrote it, so it is checked,
    not trusted: it decides nothing but that program's own episode."""
    data = b""
    while len(data) <= RECORD_BYTES:
        ready, _, _ = select.select([child.record_fd], [], [], 0)
        chunk = os.read(child.record_fd, 65536) if ready else b""
        if not chunk:
            break
        data += chunk
    with contextlib.suppress(ValueError, TypeError, KeyError):  # junk, not a worker's crash
        got = json.loads(data)
        clock = [v for v in got["clock"][:MAX_READINGS] if isinstance(v, (int, float)) and not isinstance(v, bool)]
        diverged = got["diverged"] if type(got["diverged"]) is int and -1 <= got["diverged"] < replayed else -1
        return {"clock": clock, "diverged": diverged}
    return NO_RECORD


def _answer(status: str, out: bytearray, cap: int, started: float, record: dict = NO_RECORD) -> dict:
    return {"status": status, "output": out[:cap].decode("utf-8", "replace"), "seconds": time.monotonic() - started,
            **record}


def run(request: dict, child: Standby) -> dict:
    """One program on the waiting standby: {"status": one of STATUSES, "output": its stdout and stderr (capped),
    "seconds": its wall time, "clock" and "diverged": its record (`_record`; empty when it did not end by itself)}."""
    started = time.monotonic()
    deadline = started + request["wall_s"] + request.get("replay_s", 0.0)
    with contextlib.suppress(OSError):  # a standby that died before its program read: EPIPE
        os.write(child.request_fd, json.dumps(request).encode())
    os.close(child.request_fd)
    child.request_fd = -1  # closed: its number may name the next standby's pipe
    cap, out = request["output_bytes"], bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            reap(child)
            return _answer("timeout", out, cap, started)
        ready, _, _ = select.select([child.output_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(child.output_fd, 65536)
        if not chunk:
            break
        out += chunk
        if len(out) > cap:
            reap(child)
            return _answer("output_limit", out, cap, started)
    ready, _, _ = select.select([child.status_fd], [], [], max(deadline - time.monotonic(), 0))
    if not ready:  # its output closed, the program still running
        reap(child)
        return _answer("timeout", out, cap, started)
    written = os.read(child.status_fd, 4)
    # The program's wait status, as its standby saw it; none when the standby itself ended (it could not lock
    # itself down, or was killed): then the standby's own.
    wait_status = struct.unpack("i", written)[0] if len(written) == 4 else reap(child)
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        out += f"\n(stopped by {name})".encode()
        return _answer("timeout" if sig == signal.SIGXCPU else "killed", out, cap, started)
    code = os.WEXITSTATUS(wait_status)
    status = {EXIT_OK: "ok", EXIT_RAISED: "error", EXIT_MEMORY: "memory", EXIT_LOCKDOWN: "sandbox_error"}.get(
        code, "error")
    if status == "error" and code != EXIT_RAISED:
        out += f"\n(exited with code {code})".encode()
    return _answer(status, out, cap, started, _record(child, len(request["cells"]) - 1))


WARM_UP = {  # what a preloaded module imports lazily on first use, done once here so that no child pays for it
    "sympy": "x, y = sympy.symbols('x y')\nsympy.solve([x + y - 3, x - y - 1], [x, y])\nsympy.factorint(360)\n"
             "sympy.simplify(sympy.sin(x) ** 2 + sympy.cos(x) ** 2)\nsympy.summation(x ** 2, (x, 1, 5))\n"
             "sympy.nsimplify(0.5)\nsympy.Rational(1, 3) + 1\nsympy.latex(x / 2)",
    "numpy": "numpy.linalg.solve([[2.0, 1.0], [1.0, 3.0]], [3.0, 5.0])\nnumpy.random.seed(0)",  # numpy.random: lazy
}


def main(argv: list[str]) -> None:
    root, preload = argv[0], [m for m in argv[1].split(",") if m] if len(argv) > 1 else []
    for module in preload:
        exec(WARM_UP.get(module, ""), {module: importlib.import_module(module)})
    readable_roots()  # computed once, inherited by every child
    gc.freeze()  # the warm objects stay out of the collector: children do not touch (copy) their pages for it
    disk_mb = int(argv[2]) if len(argv) > 2 else 64
    max_abi = int(argv[3]) if len(argv) > 3 else 0
    become_subreaper()  # a program's process whose standby is killed first is reparented here, not to init
    channel = sys.stdout
    child = spawn(root, disk_mb, max_abi)
    try:
        for line in sys.stdin:
            reply = run(json.loads(line), child)
            channel.write(json.dumps(reply) + "\n")
            channel.flush()
            finish(child)  # its exit and cleanup, and the next fork, after the answer is out
            child = spawn(root, disk_mb, max_abi)
    finally:
        finish(child)


if __name__ == "__main__":
    main(sys.argv[1:])
