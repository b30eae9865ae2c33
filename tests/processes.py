"""Two processes of a command joined through jax.distributed on localhost, 4 CPU devices each (the multi-host
checks run them against one process with 8)."""

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time

from xla_flags import FAST_COMPILE

FOUR_DEVICES = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4 " + FAST_COMPILE}


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
