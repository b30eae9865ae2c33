"""`trace-jax bench sampler`: sampler throughput against transformers, forks against re-prefill.

Every comparison runs both sides back to back in this process and prints a ratio; the machine's
absolute speed cancels out. Compile time is the first call's extra time over the second.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trace_jax.config import SFTConfig
from trace_jax.envs.hopworld import HopWorldConfig, build_world, protocol
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.evaluate import question_pool
from trace_jax.models import ModelConfig, Policy, save_pretrained
from trace_jax.rollout import expand as ex
from trace_jax.rollout.engine import SamplingConfig, TurnSpec, generate_turn, max_len, run_turns
from trace_jax.sharding import init_policy

MID_SIZE = ModelConfig(vocab_size=32768, hidden_size=1024, intermediate_size=3072, num_layers=8, num_heads=16,
                       num_kv_heads=8, head_dim=64, rope_theta=1e6, tie_word_embeddings=True)


def _timed(fn, *args) -> tuple[float, object]:
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t, out


def sampler_tokens_per_s(model: Policy, batch: int, prompt_len: int, steps: int, seed: int = 0
                         ) -> tuple[float, float]:
    """(generated tokens/s of our jitted sampler, compile seconds) for `batch` rows."""
    spec = TurnSpec(action_len=steps, obs_len=1, max_turns=1, stop_ids=())  # exactly `steps` tokens
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(seed)
    pool = ex.Pool(tokens=jnp.asarray(rng.integers(0, model.cfg.vocab_size, (batch, prompt_len)), jnp.int32),
                   lengths=jnp.full((batch,), prompt_len, jnp.int32), question=jnp.zeros((batch,), jnp.int32))

    @jax.jit
    def run(state, pool, key):
        m = nnx.merge(graphdef, state)
        cache, logits, v = ex.prefill(m, pool.tokens, pool.lengths, pool.tokens.shape[1])
        env = _NullEnv(spec)
        ro = ex.start_roots(m, env, pool, jnp.arange(batch, dtype=jnp.int32), jax.random.split(key, batch),
                            cache, logits, v, 0)
        return generate_turn(m, ro, spec, SamplingConfig())[0].tree.length

    first, _ = _timed(run, state, pool, jax.random.key(0))
    second, _ = _timed(run, state, pool, jax.random.key(1))
    return batch * steps / second, first - second


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _NullEnv:
    """No environment: plain decoding turns of a given TurnSpec."""

    spec: TurnSpec = dataclasses.field(metadata=dict(static=True))

    @property
    def max_turns(self) -> int:
        return self.spec.max_turns

    @property
    def action_len(self) -> int:
        return self.spec.action_len

    @property
    def obs_len(self) -> int:
        return self.spec.obs_len

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self.spec.stop_ids

    def reset(self, q):
        return jnp.zeros_like(q)


def transformers_tokens_per_s(model: Policy, batch: int, prompt_len: int, steps: int, seed: int = 0) -> float:
    """Generated tokens/s of transformers' PyTorch `generate` (sampling) on the same weights."""
    import torch
    from transformers import Qwen3ForCausalLM

    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, d)
        ref = Qwen3ForCausalLM.from_pretrained(d).eval()
    ids = torch.as_tensor(np.random.default_rng(seed).integers(0, model.cfg.vocab_size, (batch, prompt_len)))
    kwargs = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=True, top_k=0, pad_token_id=0)
    with torch.no_grad():
        ref.generate(ids[:, :4], max_new_tokens=2, do_sample=True, top_k=0, pad_token_id=0)  # warm up
        t = time.perf_counter()
        ref.generate(ids, **kwargs)
    return batch * steps / (time.perf_counter() - t)


def tree_fork_vs_reprefill(model: Policy, env: HopWorldEnv, num_prompts: int, roots_per_prompt: int, n: int,
                           seed: int = 0) -> dict[str, float]:
    """Expand a tree (forks) and, back to back, the same continuations re-prefilled from scratch."""
    m = num_prompts * roots_per_prompt
    pool = question_pool(env, np.arange(num_prompts))
    slots = jnp.repeat(jnp.arange(num_prompts, dtype=jnp.int32), roots_per_prompt)
    graphdef, state = nnx.split(model)
    sampling = SamplingConfig()

    @jax.jit
    def roots(state, key):
        mdl = nnx.merge(graphdef, state)
        cache, logits, v = ex.prefill(mdl, pool.tokens, pool.lengths, pool.tokens.shape[1])
        ro = ex.start_roots(mdl, env, pool, slots, jax.random.split(key, m), cache, logits, v, protocol.PAD)
        return run_turns(mdl, env, ro, sampling)

    ro = roots(state, jax.random.key(seed))
    rt = jax.device_get(ro.tree)
    anchors = [(s, t) for s in range(m) for t in range(int(rt.num_turns[s]) - 1)]
    rng = np.random.default_rng(seed)
    picks = [anchors[i] for i in rng.integers(0, len(anchors), m * n)]
    parent, turn = (jnp.asarray(x, jnp.int32) for x in zip(*picks))
    keys = jax.random.split(jax.random.key(seed + 1), m * n)

    @jax.jit
    def forks(state, ro, parent, turn, keys):
        mdl = nnx.merge(graphdef, state)
        cont = run_turns(mdl, env, ex.fork(env, mdl, ro, parent, turn, keys, protocol.PAD), sampling)
        return cont.tree, cont.live_tokens / (cont.tree.num_slots * cont.decode_steps)

    width = int(rt.boundaries[np.asarray(parent), np.asarray(turn)].max())

    @jax.jit
    def reprefill(state, ro, parent, turn, keys):
        mdl = nnx.merge(graphdef, state)
        return run_turns(mdl, env, ex.restart(env, mdl, ro, parent, turn, keys, width, protocol.PAD), sampling).tree

    fork_compile, _ = _timed(forks, state, ro, parent, turn, keys)
    fork_time, (cont, cont_util) = _timed(forks, state, ro, parent, turn, keys)
    re_compile, _ = _timed(reprefill, state, ro, parent, turn, keys)
    re_time, re_tree = _timed(reprefill, state, ro, parent, turn, keys)
    cont, re_tree = jax.device_get(cont), jax.device_get(re_tree)
    cut = rt.boundaries[np.asarray(parent), np.asarray(turn)]
    fork_positions = int(pool.lengths.sum()) + int(rt.model_tokens.sum()) + int(cont.model_tokens.sum())
    re_positions = int(pool.lengths.sum()) + int(rt.model_tokens.sum()) + int(cut.sum()) + int(re_tree.model_tokens.sum())
    return {
        "positions_fork": fork_positions, "positions_reprefill": re_positions,
        "positions_saved": 1 - fork_positions / re_positions,
        "time_fork": fork_time, "time_reprefill": re_time, "time_ratio": re_time / fork_time,
        "compile_fork": fork_compile - fork_time,
        "utilisation_roots": float(ro.live_tokens / (m * ro.decode_steps)),
        "utilisation_continuations": float(cont_util),
    }


def hopworld_policy(checkpoint: str | None) -> Policy:
    if checkpoint and Path(checkpoint).exists():
        from trace_jax.checkpoints import load_model
        return load_model(checkpoint)
    return init_policy(SFTConfig().model, seed=0)


def run_sampler_bench(checkpoint: str | None, batch: int, prompt_len: int, steps: int, mid_batch: int,
                      skip_mid: bool) -> None:
    policy = hopworld_policy(checkpoint)
    sizes = [("hopworld", policy, batch)] + ([] if skip_mid else [("mid-size", init_policy(MID_SIZE, 0), mid_batch)])
    print(f"sampler: {prompt_len}-token prompts, {steps} sampled tokens per row (temperature 1)")
    print(f"{'model':>10} {'params':>8} {'batch':>6} {'ours tok/s':>11} {'HF tok/s':>10} {'ratio':>6} {'compile s':>10}")
    for name, model, b in sizes:
        params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        ours, compile_s = sampler_tokens_per_s(model, b, prompt_len, steps)
        theirs = transformers_tokens_per_s(model, b, prompt_len, steps)
        print(f"{name:>10} {params / 1e6:7.1f}M {b:>6} {ours:11.0f} {theirs:10.0f} {ours / theirs:6.2f} {compile_s:10.1f}")

    wcfg = HopWorldConfig(max_hops=2, max_turns=3, num_questions=512)
    env = HopWorldEnv(build_world(wcfg), wcfg)
    print(f"\ntree: 3-turn HopWorld episodes (max_hops=2, max_turns=3), slot length "
          f"{max_len(wcfg.prompt_len, TurnSpec.of(env))}, forks vs re-prefilling each continuation")
    print(f"{'N':>3} {'positions fork':>15} {'re-prefill':>11} {'saved':>6} {'time fork s':>12} {'re-prefill s':>13} "
          f"{'speedup':>8} {'util roots':>11} {'util cont':>10}")
    for n in (2, 6):
        r = tree_fork_vs_reprefill(policy, env, num_prompts=8, roots_per_prompt=4, n=n)
        print(f"{n:>3} {r['positions_fork']:>15} {r['positions_reprefill']:>11} {100 * r['positions_saved']:5.1f}% "
              f"{r['time_fork']:12.2f} {r['time_reprefill']:13.2f} {r['time_ratio']:7.2f}x "
              f"{100 * r['utilisation_roots']:10.1f}% {100 * r['utilisation_continuations']:9.1f}%")
