"""Several processes (hosts) as one run: joining them through `jax.distributed`, and what only process 0 does.

One process needs nothing. On a Cloud TPU pod (also GKE TPU, SLURM, Open MPI) `Cluster(auto=True)` lets JAX find
the coordinator, the process count and this process's id; elsewhere all three are given. Every process computes
and writes its shards of each orbax checkpoint; only process 0 prints and writes the run's other files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How this process joins the others: not at all (the default), auto-detected, or by explicit arguments."""

    coordinator: str | None = None  # "host:port" of process 0's coordinator service
    num_processes: int | None = None  # processes in the run, each started with the same arguments but its id
    process_id: int | None = None  # this process's id in [0, num_processes)
    auto: bool = False  # detect the three (Cloud TPU pods, GKE TPU, SLURM, Open MPI)

    def __post_init__(self) -> None:
        flags = {"--coordinator": self.coordinator, "--num-processes": self.num_processes,
                 "--process-id": self.process_id}
        given = [f for f, v in flags.items() if v is not None]
        if self.auto and given:
            raise ValueError(f"--multi-host detects the cluster itself; drop {', '.join(given)}, or drop --multi-host "
                             "to give all of --coordinator, --num-processes and --process-id")
        if given and len(given) < len(flags):
            missing = [f for f in flags if f not in given]
            raise ValueError(f"{', '.join(given)} given without {', '.join(missing)}: joining processes needs all of "
                             "--coordinator HOST:PORT, --num-processes N and --process-id I (or --multi-host on a "
                             "TPU pod)")
        if not given:
            return
        host, _, port = self.coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--coordinator must be HOST:PORT (e.g. 10.0.0.2:8476), got {self.coordinator!r}")
        if self.num_processes < 1:
            raise ValueError(f"--num-processes must be >= 1, got {self.num_processes}")
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"--process-id must be in [0, {self.num_processes}) for --num-processes "
                             f"{self.num_processes}, got {self.process_id}")

    @property
    def joins(self) -> bool:
        return self.auto or self.coordinator is not None


def join(cluster: Cluster) -> None:
    """Initialise `jax.distributed` for `cluster` (nothing for a lone process); before any other JAX call.
    CPU devices of different processes talk through gloo."""
    if not cluster.joins:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(cluster.coordinator, cluster.num_processes, cluster.process_id)
    except ValueError as e:
        if not cluster.auto:
            raise
        raise ValueError(f"--multi-host found no cluster to join ({e}): it detects Cloud TPU slices, GKE TPU, SLURM "
                         "and Open MPI; elsewhere give --coordinator, --num-processes and --process-id") from e


def is_main() -> bool:
    """True in process 0, the one that prints and writes the run's logs, metrics and plots."""
    return jax.process_index() == 0


def any_process(flag: bool) -> bool:
    """True on every process when `flag` is True on any (all processes must call it, at the same point)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


def main_first(name: str, make: Callable[[], T]) -> T:
    """make() in process 0 first, then (after a barrier named `name`) in the others: e.g. building a dataset on a
    shared disk once, which the others then find built (or build on their own disk)."""
    if jax.process_count() == 1:
        return make()
    out = make() if is_main() else None
    multihost_utils.sync_global_devices(name)
    return out if is_main() else make()


@contextlib.contextmanager
def stdout_from_main() -> Iterator[None]:
    """Within: processes other than 0 print nothing to stdout (their errors still reach stderr)."""
    if is_main():
        yield
        return
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        yield
