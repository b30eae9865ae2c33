"""Two processes of a command joined through jax.distributed on localhost, 4 CPU devices each (the multi-host
checks run them against one process with 8)."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from xla_flags import host_flags

# Without the session's compilation cache: only process 0 writes it, so with it warm process 0 runs programs from it
# while process 1 compiles its own, and two processes of XLA:CPU's gloo collectives were seen to run different
# collectives at one point and wait on each other for good (docs/measurements/fork_copy_ring.md). Process 0 waits
# for process 1 at the first collective anyway, so the cache saved no time.
FOUR_DEVICES = {**{k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"},
                "XLA_FLAGS": host_flags(4)}


ONE_DEVICE_CLI = str(Path(__file__).parent / "one_device_cli.py")  # `trace-jax` on one device's mesh, as the tests run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def two_processes(make_cmd, timeout: float, codes: tuple[int, int] = (0, 0), signal_process_1=None
                  ) -> list[subprocess.CompletedProcess]:
    """Runs make_cmd(port, process_id) for ids 0 and 1 together and checks their exit codes; if one fails, the other
    is ended (it would wait for its peer until jax.distributed's timeout). signal_process_1: a condition polled
    while they run; once it holds, process 1 (only) gets SIGTERM. Their output goes to files (a pipe read only at
    the end fills and blocks a chatty process)."""
    port = _free_port()
    with contextlib.ExitStack() as stack:
        files = [tuple(stack.enter_context(tempfile.TemporaryFile("w+")) for _ in "oe") for _ in range(2)]
        procs = [subprocess.Popen(make_cmd(port, i), env=FOUR_DEVICES, stdout=out, stderr=err, text=True)
                 for i, (out, err) in enumerate(files)]
        deadline = time.time() + timeout
        try:
            while any(p.poll() is None for p in procs):
                if time.time() > deadline or any(p.poll() not in (None, *codes) for p in procs):
                    break
                if signal_process_1 is not None and signal_process_1():
                    procs[1].send_signal(signal.SIGTERM)
                    signal_process_1 = None
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        outs = [tuple(f.seek(0) or f.read() for f in pair) for pair in files]
    for i, (p, code, (_, err)) in enumerate(zip(procs, codes, outs)):
        assert p.returncode == code, f"process {i} exited with {p.returncode}, not {code}:\n{err[-3000:]}"
    return [subprocess.CompletedProcess(p.args, p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def float32_tolerance(key: str) -> tuple[float, float]:
    """(rtol, atol) for a logged metric of two runs whose float32 reductions run in another order: equal to ~1e-7
    relative. A spread (std) of values near their mean m loses m^2 / var digits to cancellation; ratio_max_dev, the
    largest |ratio - 1| of an on-policy step, is float32 noise in either run (a few ulps of 1.2e-7 at 1, up to ~3e-6
    over some thousand tokens): both small, not equal."""
    return (2e-4 if key.endswith("_std") else 1e-5, 1e-5 if key == "ratio_max_dev" else 1e-7)


def logged_rows(path: Path) -> list[dict]:
    """A run's JSONL log (metrics, allocation, evaluation answers), one dict per line, wall-clock fields left out."""
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("_seconds")}
            for line in path.read_text().splitlines()]


def assert_rows_close(want: list[dict], got: list[dict], tolerance: Callable[[str], tuple[float, float]]) -> None:
    """Two runs' logged rows: the same rows and keys, each value within tolerance(key) = (rtol, atol). A null (an
    undefined value, NaN in the run) reads as NaN, equal to NaN."""
    assert len(want) == len(got)
    for x, y in zip(want, got):
        assert x.keys() == y.keys()
        for key in x:
            rtol, atol = tolerance(key)
            np.testing.assert_allclose(np.asarray(y[key], float), np.asarray(x[key], float), rtol=rtol, atol=atol,
                                       err_msg=f"step {x.get('step')} {key}")


def kill_once_saved(cmd: list[str], saved: Path, timeout: float = 300) -> None:
    """Runs cmd (a training run) and SIGKILLs it as soon as `saved` (a checkpoint's file) exists."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while not saved.exists():
        assert proc.poll() is None and time.time() < deadline, f"the run ended or hung before {saved} was written"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

