"""Pre-started worker processes that answer JSON requests, one at a time each, under a per-request timeout.

The sandbox (`sandbox.py`) and the verifier (`verifier.py`) run their work in such workers: model-written code and a
symbolic comparison that may never end both stay out of the trainer, and a worker that dies or hangs is killed,
answered for, and replaced. A worker is `python -s -P -m MODULE ARGS...` (isolated, hash seed 0) reading one JSON
request per line on stdin and writing one JSON answer per line on stdout.
"""

from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any


class Worker:
    """One worker process and the pipe pair to it."""

    def __init__(self, module: str, args: Sequence[str], cwd: str | None = None):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "JAX", "XLA", "TF_"))}
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # safe to fork, one core
        env.update(PYTHONHASHSEED="0")  # every worker hashes (orders sets of strings) alike: a replay elsewhere too
        # -I but for -E (which would ignore PYTHONHASHSEED): no user site, no script folder on sys.path
        self.proc = subprocess.Popen([sys.executable, "-s", "-P", "-m", module, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd, text=True,
                                     bufsize=1)

    def ask(self, request: dict, timeout: float) -> dict | None:
        """The answer to `request`; None (the worker killed) if the worker died or did not answer in `timeout`."""
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)  # a worker writes its answer in one line
        answer = self.proc.stdout.readline() if ready else ""
        if not answer:
            self.kill()
            return None
        return json.loads(answer)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        self.kill()


class WorkerPool:
    """`size` workers of `module`; `ask_many` spreads requests over them. `restarts` counts replaced workers."""

    def __init__(self, module: str, args: Sequence[str] = (), size: int = 0, cwd: str | None = None):
        self.module, self.args, self.cwd = module, tuple(args), cwd
        self.size = size or os.cpu_count() or 1
        self.restarts = 0
        self._idle: queue.Queue[Worker] = queue.Queue()
        for _ in range(self.size):
            self._idle.put(Worker(module, self.args, cwd))

    def ask_many(self, requests: Sequence[dict], timeout: float, failed: Callable[[dict], Any]) -> list[Any]:
        """Each request's answer, concurrently, in order; `failed(request)` stands in for a worker that died or
        ran past `timeout` seconds."""
        answers: list[Any] = [None] * len(requests)
        todo: queue.Queue[int] = queue.Queue()
        for i in range(len(requests)):
            todo.put(i)

        def serve() -> None:
            worker = self._idle.get()
            try:
                while True:
                    try:
                        i = todo.get_nowait()
                    except queue.Empty:
                        return
                    answer = worker.ask(requests[i], timeout)
                    answers[i] = failed(requests[i]) if answer is None else answer
                    if not worker.alive():
                        self.restarts += 1
                        worker = Worker(self.module, self.args, self.cwd)
            finally:
                self._idle.put(worker)

        threads = [threading.Thread(target=serve) for _ in range(min(self.size, len(requests)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return answers

    def pids(self) -> list[int]:
        """The process ids of the idle workers (all of them between calls)."""
        return [w.proc.pid for w in list(self._idle.queue)]

    def close(self) -> None:
        while not self._idle.empty():
            self._idle.get().close()
