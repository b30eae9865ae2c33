"""The math family's code interpreter: a pool of pre-started sandbox workers (`sandbox_worker`), from the trainer.

`SandboxPool.run_many` serves a turn's programs concurrently, one per worker at a time; each program is a list
of cells, the earlier ones replayed silently so the last sees their variables. Given the results the earlier cells
got when they ran, a replay reproduces them (their clock readings replayed, the same seeds on every worker), is
checked against them (`Result.diverged`: the first earlier cell that printed otherwise), and is not charged to the
limits (`replay_budget`). Whatever a program does (raises,
loops, allocates, forks, opens sockets, deletes files, prints megabytes, kills its worker) ends as a `Result` for
that program alone: the pool restarts a dead worker and goes on. `observation` turns a result into the text the
policy reads.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from trace_jax.envs.math.lockdown import LockdownError
from trace_jax.envs.math.workers import WorkerPool

PRELOAD = ("math", "fractions", "itertools", "functools", "collections", "numpy", "sympy")


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    workers: int = 0  # pre-started worker processes (0: one per CPU core)
    cpu_s: int = 5  # CPU seconds a program may use
    wall_s: float = 10.0  # wall-clock seconds a program's last cell may take (its replay of earlier ones aside)
    memory_mb: int = 512  # address space a program may add beyond its warm start
    file_mb: int = 16  # size of any file it writes in its private folder
    disk_mb: int = 64  # all of its files: its folder is a private tmpfs of this size (where the kernel allows)
    output_bytes: int = 4096  # stdout + stderr kept; a program that writes more is stopped
    observation_chars: int = 512  # the observation keeps the output's head and tail within this many characters
    landlock_abi: int = 0  # use no newer Landlock ABI than this (0: the kernel's); lower runs older kernels' paths

    def __post_init__(self) -> None:
        if self.landlock_abi < 0:
            raise ValueError(f"task.sandbox.landlock_abi={self.landlock_abi}: use 0 (the kernel's ABI) or a Landlock "
                             "ABI version from 1 up")


@dataclasses.dataclass(frozen=True)
class Result:
    status: str  # ok, error, timeout, memory, output_limit, killed, sandbox_error (sandbox_worker.STATUSES)
    output: str  # what the program printed (stdout and stderr interleaved), capped at output_bytes
    seconds: float = 0.0  # its wall time, replay included, as the worker measured it
    clock: tuple[float, ...] = ()  # the time module's readings its last cell took (replayed in later programs)
    diverged: int = -1  # the first earlier cell whose replay printed otherwise than its result (-1: none)

    def __post_init__(self) -> None:
        object.__setattr__(self, "clock", tuple(self.clock))


def replay_budget(ran: Sequence[Result]) -> float:
    """Seconds added to a program's CPU and wall limits for replaying the cells whose results are `ran`: twice
    the wall time of the program that ran the last of them (it replayed the others), and a second."""
    return 2.0 * ran[-1].seconds + 1.0 if ran else 0.0


def observation(result: Result, cfg: SandboxConfig) -> str:
    """The text the policy reads after its code block: the output (head and tail kept) and, if it did not end
    normally, why."""
    text = result.output.strip()
    half = cfg.observation_chars // 2
    if len(text) > cfg.observation_chars:
        text = f"{text[:half]}\n...\n{text[-half:]}"
    note = {
        "timeout": f"Timeout: the program ran past its limit ({cfg.cpu_s} s CPU, {cfg.wall_s:g} s) and was stopped.",
        "memory": f"MemoryError: the program ran past its {cfg.memory_mb} MB memory limit.",
        "output_limit": f"Output limit: the program printed more than {cfg.output_bytes} bytes and was stopped.",
        "killed": "The program was killed.",
        "sandbox_error": "Sandbox error: the program could not be run.",
    }.get(result.status)
    if note:
        text = f"{text}\n{note}" if text else note
    if result.diverged >= 0:
        text = (f"Note: re-run to restore this cell's variables, cell {result.diverged + 1} printed otherwise than it "
                f"did, so they may differ from what you saw.\n{text}")
    return text or "(no output)"


def check_kernel() -> dict:
    """What the kernel lets the sandbox do (`lockdown.probe`, in a process of its own); raises `LockdownError`
    where programs could not be confined, and warns once where their files stay on the host's disk."""
    got = subprocess.run([sys.executable, "-I", "-m", "trace_jax.envs.math.lockdown"], capture_output=True,
                         text=True, check=False)
    if got.returncode != 0:
        raise LockdownError(f"the sandbox's kernel probe failed: {got.stderr.strip()[-500:]}")
    kernel = json.loads(got.stdout)
    if kernel["landlock_abi"] < 1:
        raise LockdownError("this kernel has no Landlock, so sandboxed programs could read and delete the host's "
                            "files: run on Linux >= 5.13 with landlock in its LSM list (cat /sys/kernel/security/lsm)")
    if kernel["namespaces"] and not _warned:
        _warned.append(True)
        print(f"sandbox: no private namespaces per program ({kernel['namespaces']}); a program's files are bounded "
              "per file (file_mb), not in all", file=sys.stderr)
    return kernel


_warned: list[bool] = []


class SandboxPool:
    """Pre-started sandbox workers under a private root folder; use as a context manager, or call `close`."""

    def __init__(self, cfg: SandboxConfig = SandboxConfig(), preload: Sequence[str] = PRELOAD):
        self.cfg = cfg
        self.kernel = check_kernel()
        self.root = tempfile.mkdtemp(prefix="trace-jax-sandbox-")
        args = [self.root, ",".join(preload), str(cfg.disk_mb), str(cfg.landlock_abi)]
        self.workers = WorkerPool("trace_jax.envs.math.sandbox_worker", args, cfg.workers, cwd=self.root)

    def run(self, cells: Sequence[str], ran: Sequence[Result] | None = None) -> Result:
        """One program: `cells` run in order in one fresh process, the output of the last returned; `ran`: the
        results the earlier cells got when they ran, which their replay reproduces and is checked against."""
        return self.run_many([cells], None if ran is None else [ran])[0]

    def run_many(self, programs: Sequence[Sequence[str]], ran: Sequence[Sequence[Result]] | None = None
                 ) -> list[Result]:
        """Each program on the next free worker, concurrently; results in the programs' order. ran: per program,
        its earlier cells' results (`run`), or None to replay them unchecked."""
        c = self.cfg
        requests = [dict(cells=list(cells), cpu_s=c.cpu_s, wall_s=c.wall_s, memory_mb=c.memory_mb,
                         file_mb=c.file_mb, output_bytes=c.output_bytes) for cells in programs]
        for request, earlier in zip(requests, ran or ()):
            if len(earlier) != len(request["cells"]) - 1:
                raise ValueError(f"{len(earlier)} results for the {len(request['cells']) - 1} earlier cells")
            request.update(expected=[r.output for r in earlier], clocks=[list(r.clock) for r in earlier],
                           replay_s=replay_budget(earlier))
        died = lambda _: {"status": "sandbox_error", "output": "the sandbox worker died"}
        budget = max((r.get("replay_s", 0.0) for r in requests), default=0.0)
        return [Result(**a) for a in self.workers.ask_many(requests, c.wall_s + budget + 30.0, died)]

    def close(self) -> None:
        self.workers.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
