"""A step's prompt pool as global arrays: each process loads only the rows its devices hold.

The jitted step sees the same global Pool [B, P] on any number of processes; rows are split over the mesh's batch
axes (`sharding.batch_sharding`), or replicated when B does not divide them.
"""

from __future__ import annotations

import numpy as np
from jax.sharding import Mesh

from trace_jax import sharding as shd
from trace_jax.data.loader import PromptLoader
from trace_jax.rollout.expand import Pool


def pool_rows(loader: PromptLoader, mesh: Mesh) -> np.ndarray:
    """The rows of each pool [B, P] of `loader` that this process loads (sorted indices in [0, B))."""
    shape = (loader.batch_size, loader.prompt_ids.shape[1])
    return shd.process_rows(shd.batch_sharding(shape, mesh), shape)


def global_pool(loader: PromptLoader, step: int, mesh: Mesh) -> Pool:
    """Batch `step` of `loader` as a Pool of global arrays on `mesh`, assembled from this process's rows."""
    rows = pool_rows(loader, mesh)
    batch = loader.batch(step, rows)

    def put(x: np.ndarray):
        shape = (loader.batch_size, *x.shape[1:])
        return shd.from_process_rows(x, rows, loader.batch_size, shd.batch_sharding(shape, mesh))

    return Pool(tokens=put(batch["prompt_ids"]), lengths=put(batch["prompt_len"]), question=put(batch["question_id"]))
