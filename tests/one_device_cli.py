"""`python tests/one_device_cli.py ARGS...`: `trace-jax ARGS...` in a process of its own, on one device's mesh as the
tests' own runs are (`one_device`): its programs are then the ones the session compiled already, read from the
session's compilation cache (the kill-and-resume tests' killed runs: ~20 s of compiling each otherwise)."""

import sys

import one_device

from trace_jax.cli import main

one_device.sharding.make_mesh = one_device.make_mesh
sys.exit(main(sys.argv[1:]))
