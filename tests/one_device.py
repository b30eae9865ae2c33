"""`make_mesh` on one device unless the devices are named: what a run gets on a CPU machine outside the tests, in a
process that keeps the 8 host devices of the sharding tests (tests/conftest.py). On 2 cores, runs over the 8
simulated devices' mesh compile and run partitioned programs slower, for nothing a test that is not about sharding
checks; and XLA's compilation cache keys a program by the process's device count, so the tests' processes and the
notebooks' kernels keep 8 devices and share compiled programs by running on this mesh."""

from collections.abc import Sequence

import jax

from trace_jax import sharding
from trace_jax.config import MeshConfig

_over_devices = sharding.make_mesh


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """`sharding.make_mesh` over the first device when `devices` is None."""
    return _over_devices(cfg, jax.devices()[:1] if devices is None else devices)
