"""The multi-process host-path check's expansion, shared by the test (one process, 8 devices) and
two_process_host.py (two processes, 4 devices each)."""

import jax
import numpy as np

from toy import TINY_POLICY, tiny_env
from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.config import MeshConfig
from trace_jax.envs.hopworld import protocol
from trace_jax.envs.hopworld.host import HopWorldHost
from trace_jax.evaluate import question_pool
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.host import expand_host
from trace_jax.rollout.tree import Tree


def expand_on_host_mesh() -> tuple[Tree, list[int]]:
    """A TRACE 8x2 tree over 8 questions on an 8-device data mesh, the environment on the host: (tree, the
    number of live slots this process's environment answered per call)."""
    mesh = shd.make_mesh(MeshConfig(data=8, fsdp=1, tensor=1))
    env = tiny_env()
    pool = question_pool(env, np.arange(8))
    pool = shd.put_global(pool, jax.tree.map(lambda a: shd.batch_sharding(a.shape, mesh), pool))
    host = HopWorldHost(env)
    tree, _, _ = expand_host(shd.init_policy(TINY_POLICY, seed=0, mesh=mesh), host, pool, jax.random.key(3),
                             plan=Plan(Allocator("trace"), roots=8, continuations=2), sampling=SamplingConfig(0.8),
                             pad_id=protocol.PAD, mesh=mesh)
    return tree, host.live_per_call
