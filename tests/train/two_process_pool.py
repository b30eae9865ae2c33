"""One of the two processes of test_multihost's pool check (not a test module): joins the other through
jax.distributed, then prints one JSON line: the pool rows it loads, the global pool of step 3 gathered back, and
whether any process asked to stop (process 1 does).

usage: python two_process_pool.py PORT PROCESS_ID key=value ...
"""

import json
import sys

from trace_jax import distributed

port, process_id, *overrides = sys.argv[1:]
distributed.join(distributed.Cluster(f"localhost:{port}", 2, int(process_id)))

from trace_jax import sharding as shd  # noqa: E402 (after joining: the first JAX call sees all processes)
from trace_jax.config import TrainConfig, load_config  # noqa: E402
from trace_jax.data.global_pool import global_pool, pool_rows  # noqa: E402
from trace_jax.data.loader import hopworld_loader  # noqa: E402

cfg = load_config(TrainConfig, None, overrides)
loader = hopworld_loader(cfg.data_dir, cfg.world, "train", cfg.pool_size, cfg.seed)
mesh = shd.make_mesh(cfg.mesh)
pool = global_pool(loader, 3, mesh)
print(json.dumps({"rows": pool_rows(loader, mesh).tolist(), "question": shd.to_host(pool.question).tolist(),
                  "tokens": shd.to_host(pool.tokens).tolist(), "stop": distributed.any_process(process_id == "1")}))
