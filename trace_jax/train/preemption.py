"""Preemption: SIGTERM (a spot VM reclaimed, a pod evicted) ends a run cleanly at the next step boundary."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

EXIT_CODE = 128 + signal.SIGTERM  # what a process ended by SIGTERM reports: the scheduler sees a termination


class Preempted(Exception):
    """The run stopped on SIGTERM after its step `step` was logged and checkpointed."""

    def __init__(self, out_dir: str, step: int) -> None:
        super().__init__(f"preempted (SIGTERM) after step {step}; its checkpoint is saved in {out_dir}/checkpoints. "
                         "The same command continues it")
        self.step = step


@contextlib.contextmanager
def sigterm_stops() -> Iterator[Callable[[], bool]]:
    """Within: SIGTERM asks the run to stop instead of killing it; yields `requested() -> bool`. Outside the
    main thread (where Python delivers signals) nothing is installed and `requested` stays False."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    got = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.set())
    try:
        yield got.is_set
    finally:
        signal.signal(signal.SIGTERM, previous)
