"""One of the two processes of test_multihost's host-path check (not a test module): joins the other through
jax.distributed, expands a TRACE tree with HopWorld's environment on the host over the 8 devices of both, each
process answering its own slots, and writes the tree (gathered) and its environment's calls as JSON to OUT (a
file: the tree is too large for a pipe the parent reads only at the end).

usage: python two_process_host.py PORT PROCESS_ID OUT
"""

import json
import sys
from pathlib import Path

from trace_jax import distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: toy.py
port, process_id, out = sys.argv[1:]
distributed.join(distributed.Cluster(f"localhost:{port}", 2, int(process_id)))

from host_tree import expand_on_host_mesh  # noqa: E402 (after joining: the first JAX call sees all processes)

from trace_jax import sharding as shd  # noqa: E402

tree, calls = expand_on_host_mesh()
Path(out).write_text(json.dumps({"calls": calls, **{k: v.tolist() for k, v in shd.to_host(vars(tree)).items()}}))
