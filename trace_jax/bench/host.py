"""`trace-jax bench host`: what the host path costs beyond its tool.

The same TRACE tree (same key, same slots: `rollout.host` is tested equal) is expanded twice: inside one
jit with the JAX HopWorld env, and through the host path with HopWorld's reference env on the host.
The host path's glue (per-turn dispatch, device-to-host copies, Python) is its wall time minus the tool's
own time minus the jitted expansion's time; printed per turn and as a share of the jitted expansion.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import jax
import numpy as np

from trace_jax.allocation import Allocator, Plan
from trace_jax.checkpoints import load_model
from trace_jax.config import SFTConfig
from trace_jax.envs.hopworld import HopWorldConfig, build_world, protocol
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.envs.hopworld.host import HopWorldHost
from trace_jax.evaluate import question_pool
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import expand_tree
from trace_jax.rollout.host import expand_host
from trace_jax.sharding import init_policy


def run_host_bench(checkpoint: str, pool_size: int, roots: int, continuations: int, repeats: int) -> dict[str, float]:
    model = load_model(checkpoint) if Path(checkpoint).exists() else init_policy(SFTConfig().model, 0)
    env = HopWorldEnv(build_world(HopWorldConfig()), HopWorldConfig())
    host = HopWorldHost(env)
    pool = question_pool(env, np.arange(pool_size))
    plan = Plan(Allocator("trace", group_size=2), roots=roots, continuations=continuations)
    kw = dict(plan=plan, sampling=SamplingConfig(1.0), pad_id=protocol.PAD)
    jitted, hosted, tool, turns = [], [], [], []
    for r in range(repeats + 1):  # the first round compiles
        key = jax.random.key(r)
        t0 = time.perf_counter()
        jax.block_until_ready(expand_tree(model, env, pool, key, **kw))
        t1 = time.perf_counter()
        host.seconds, host.live_per_call = 0.0, []
        jax.block_until_ready(expand_host(model, host, pool, key, **kw))
        t2 = time.perf_counter()
        if r:
            jitted.append(t1 - t0)
            hosted.append(t2 - t1)
            tool.append(host.seconds)
            turns.append(len(host.live_per_call))
    j, h, t, n = (statistics.median(x) for x in (jitted, hosted, tool, turns))
    glue = h - t - j
    print(f"bench host: TRACE tree of {roots}x{continuations} over a pool of {pool_size} HopWorld prompts, "
          f"median of {repeats}")
    print(f"  jitted expansion (JAX env inside):    {1e3 * j:8.1f} ms")
    print(f"  host expansion (env on the host):     {1e3 * h:8.1f} ms, of which the env itself {1e3 * t:.1f} ms "
          f"over {n:.0f} turns")
    print(f"  host-path overhead (tool excluded):   {1e3 * glue:8.1f} ms = {1e3 * glue / n:.2f} ms per turn = "
          f"{100 * glue / j:.1f}% of the jitted expansion")
    return {"jitted_s": j, "host_s": h, "tool_s": t, "turns": n, "overhead_fraction": glue / j}
