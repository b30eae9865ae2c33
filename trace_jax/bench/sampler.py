"""`trace-jax bench sampler`: sampler throughput against transformers, the token draws alone, forks against
re-prefill, slot refill against synchronous turns, the tree-packed update against the unpacked one.

Every comparison runs both sides in this process, several times each, the sides taking turns (`alternate`), and
prints the median, the spread and the ratio of medians; the machine's absolute speed cancels out. Compile time is
the first call's extra time over the median.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.config import MeshConfig, SFTConfig, TrainConfig
from trace_jax.envs.hopworld import HopWorldConfig, build_world, protocol
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.evaluate import question_pool
from trace_jax.memory.plan import PRESETS
from trace_jax.models import ModelConfig, Policy
from trace_jax.models.hf_io import from_pretrained, save_pretrained
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import matmul
from trace_jax.rollout import expand as ex
from trace_jax.rollout import refill, sampling
from trace_jax.rollout.engine import SamplingConfig, TurnSpec, generate_turn, max_len, run_turns
from trace_jax.sharding import init_policy
from trace_jax.train.loop import placed
from trace_jax.train.packing import prompt_sizes
from trace_jax.train.step import StepSpec, tree_grads

MID_SIZE = ModelConfig(vocab_size=32768, hidden_size=1024, intermediate_size=3072, num_layers=8, num_heads=16,
                       num_kv_heads=8, head_dim=64, rope_theta=1e6, tie_word_embeddings=True)


def _timed(fn, *args) -> tuple[float, object]:
    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t, out


@dataclasses.dataclass(frozen=True)
class Timed:
    """One side of a comparison: its timed calls and what they returned."""

    times: np.ndarray  # [repeats] seconds of each timed call
    compile_s: float  # the first (compiling) call's extra seconds over the median
    outputs: list  # [repeats] each timed call's output


def alternate(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, Timed]:
    """Time each side's call `repeats` times after a first, compiling call of each, the sides taking turns: a round
    times every side once, in reverse order every other round. A machine whose speed drifts within minutes (these
    2-core machines do, by up to 1.3x) then slows both sides alike, where timing one side's calls, then the other's,
    hands the drift to the ratio."""
    first = {name: _timed(fn)[0] for name, fn in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    outputs: dict[str, list[object]] = {name: [] for name in sides}
    order = list(sides)
    for round_ in range(repeats):
        for name in order if round_ % 2 == 0 else order[::-1]:
            t, out = _timed(sides[name])
            times[name].append(t)
            outputs[name].append(out)
    return {name: Timed(np.asarray(times[name]), max(first[name] - float(np.median(times[name])), 0.0),
                        outputs[name]) for name in sides}


def spread(times: np.ndarray) -> str:
    """'median s [min-max]' of a few timings."""
    return f"{np.median(times):.3f} [{times.min():.3f}-{times.max():.3f}]"


def sampler_run(model: Policy, batch: int, prompt_len: int, steps: int, seed: int = 0, draw: str = "gumbel",
                mesh: Mesh | None = None) -> Callable[[], float]:
    """One run of our jitted sampler on `batch` rows, as a call: the prompts' prefill (into the root slots) and the
    decode loop of `steps` tokens drawn by `draw` (`sampling.DRAWS`), two calls back to back, with the model split
    once (`bind`), as a training step holds its parameters (not NNX's walk of the module at every call). mesh: the
    rows split over its data axes as a training step splits its slots (`sharding.constrain_rows`; the model
    replicated), each device decoding its share. Returns the decode loop's seconds."""
    spec = TurnSpec(action_len=steps, obs_len=1, max_turns=1, stop_ids=())  # exactly `steps` tokens
    rng = np.random.default_rng(seed)
    pool = ex.Pool(tokens=jnp.asarray(rng.integers(0, model.cfg.vocab_size, (batch, prompt_len)), jnp.int32),
                   lengths=jnp.full((batch,), prompt_len, jnp.int32), question=jnp.zeros((batch,), jnp.int32))
    if mesh is not None:
        model, pool = nnx.merge(*placed(model, mesh)), shd.rows_on(pool, mesh)

    def start(m, pool, key):
        return shd.constrain_rows(ex.start_roots(m, _NullEnv(spec), pool, ex.prefill_pool(m, pool),
                                                 jnp.arange(batch, dtype=jnp.int32), jax.random.split(key, batch),
                                                 pad_id=0), mesh)

    def decode(m, ro):
        ro = generate_turn(m, shd.constrain_rows(ro, mesh), spec=spec, sampling=SamplingConfig(draw=draw))[0]
        return shd.constrain_rows(ro.tree.length, mesh)

    start, decode = jit_with_model(start).bind(model), jit_with_model(decode).bind(model)
    key = jax.random.key(1)

    def run() -> float:
        return _timed(decode, jax.block_until_ready(start(pool, key)))[0]

    return run


def transformers_run(model: Policy, batch: int, prompt_len: int, steps: int, seed: int = 0) -> Callable[[], None]:
    """One run of transformers' PyTorch `generate` (sampling, `steps` new tokens a row) on the same weights, in the
    model's dtype, as a call."""
    import torch
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, d)
        ref = Qwen3ForCausalLM.from_pretrained(d, dtype=getattr(torch, model.cfg.dtype)).eval()
    ids = torch.as_tensor(np.random.default_rng(seed).integers(0, model.cfg.vocab_size, (batch, prompt_len)))
    kwargs = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=True, top_k=0, pad_token_id=0)

    def run() -> None:
        with torch.no_grad():
            ref.generate(ids, **kwargs)

    return run


Side = tuple[str, int]  # (draw, devices) of one of our sampler's sides: the draw and the devices its rows split over


def sampler_vs_transformers(model: Policy, batch: int, prompt_len: int, steps: int, repeats: int = 5,
                            seed: int = 0, draws: tuple[str, ...] = sampling.DRAWS, mesh: Mesh | None = None
                            ) -> dict[str, dict | np.ndarray]:
    """Per timed run [repeats]: generated tokens/s of our sampler on one device with each of `draws` and, given a
    mesh, with the default draw and its rows split over the mesh (`ours[side]`, a `Side`: the prompts' prefill and
    the decode loop; `decode[side]`: the same tokens over the loop's time alone), of transformers' `generate`
    (`transformers`) on the same weights, batch and lengths, and the FLOP/s of `dot_run` at the decode step's shapes
    (`dot`), all taking turns (`alternate`); `compile[side]`: our first call's extra seconds."""
    dot, dot_flops = dot_run(batch, model.cfg)
    sides: dict[Side, Callable[[], float]] = {(d, 1): sampler_run(model, batch, prompt_len, steps, seed, d)
                                              for d in draws}
    if mesh is not None:
        sides[(draws[0], mesh.size)] = sampler_run(model, batch, prompt_len, steps, seed, draws[0], mesh)
    t = alternate({**sides, "transformers": transformers_run(model, batch, prompt_len, steps, seed), "dot": dot},
                  repeats)
    tokens = batch * steps
    return {"ours": {s: tokens / t[s].times for s in sides}, "decode": {s: tokens / np.asarray(t[s].outputs)
                                                                        for s in sides},
            "transformers": tokens / t["transformers"].times, "dot": dot_flops / t["dot"].times,
            "compile": {s: t[s].compile_s for s in sides}}


def host_mesh(batch: int) -> Mesh | None:
    """A data mesh over this host's CPU devices (`--host-devices`) for the sampler's split side, when there are
    several and they divide `batch` (otherwise None, saying why when there are several)."""
    devices = jax.devices()
    if jax.default_backend() != "cpu" or len(devices) < 2:
        return None
    if batch % len(devices):
        print(f"  (no split row at batch {batch}: {len(devices)} host devices do not divide it; set --host-devices "
              "to a divisor)")
        return None
    return shd.make_mesh(MeshConfig(data=-1), devices)


DRAW_SIDES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "jax.random": lambda keys, logits: jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32),
    "gumbel": sampling.categorical,  # the tokens of jax.random.categorical
    "inverse_cdf": sampling.inverse_cdf,
}


def draws_alone(rows: int, vocab: int, repeats: int = 5, seed: int = 0) -> tuple[dict[str, Timed], int]:
    """(the token draw alone of each of `DRAW_SIDES` from [rows, vocab] float32 logits, taking turns (`alternate`),
    draws a timed call). A call chains its draws in a loop, each under keys folded from the last draw's first token,
    on the logits times a factor of 1 computed from that token (as a decode step's draw gets new logits: nothing is
    hoisted out of the loop, folded at compile time or skipped); it returns its last draw's tokens [rows], so draws
    of the same tokens end alike."""
    logits = jnp.asarray(np.random.default_rng(seed).normal(size=(rows, vocab)) * 3.0, jnp.float32)
    calls = int(np.clip(2**24 // (rows * vocab), 4, 1000))  # about 16M logits drawn from a call

    def chain(draw):
        def run(logits):
            def body(i, tokens):
                scaled = logits * (tokens[0] >= 0).astype(jnp.float32)  # times 1, which the compiler cannot know
                return draw(jax.random.split(jax.random.fold_in(jax.random.key(seed), i + tokens[0]), rows), scaled)

            return jax.lax.fori_loop(0, calls, body, jnp.zeros((rows,), jnp.int32))

        return functools.partial(jax.jit(run), logits)

    return alternate({name: chain(draw) for name, draw in DRAW_SIDES.items()}, repeats), calls


def decode_flops_per_token(cfg: ModelConfig, context: int) -> int:
    """Multiply-adds x 2 of one sampled token: every projection (attention, MLP, the output head) and attention's
    scores and weighted sum over `context` cached positions."""
    d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_layer = d * (2 * q + 2 * kv) + 3 * d * cfg.intermediate_size + 2 * q * context
    return 2 * (cfg.num_layers * per_layer + d * cfg.vocab_size)


def dot_run(rows: int, cfg: ModelConfig) -> tuple[Callable[[], jax.Array], int]:
    """(a call, its FLOPs): a jitted chain of matmuls [rows, hidden] x [hidden, intermediate] in the model's dtype, as
    the model runs its matmuls (`qwen3.matmul`; in float32 a plain `jnp.dot`), the MLP's up projection of one decode
    step: timed, the matmul limit of this machine at the sampler's shapes."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, cfg.hidden_size)), cfg.jnp_dtype)
    w = jnp.asarray(rng.normal(size=(cfg.hidden_size, cfg.intermediate_size)), cfg.jnp_dtype)
    calls = 50  # one call: this many dots, each depending on the last (no dot is skipped)
    chain = jax.jit(lambda x, w: jax.lax.fori_loop(
        0, calls, lambda _, y: matmul("rd,df->rf", y, w)[:, : x.shape[1]] * 1e-3, x))
    return functools.partial(chain, x, w), 2 * rows * cfg.hidden_size * cfg.intermediate_size * calls


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


def tree_fork_vs_reprefill(model: Policy, env: HopWorldEnv, num_prompts: int, roots_per_prompt: int, n: int,
                           repeats: int = 3, seed: int = 0) -> dict[str, float]:
    """Expand a tree (forks) and the same continuations re-prefilled from scratch, taking turns (`alternate`).

    Both paths run their continuations in slots of the same length L. Positions: `processed` is rows x
    positions of every forward (padding and idle slots included), measured from the forwards' inputs;
    `useful` the real tokens the path has to feed (prompts, prefixes it recomputes, new tokens).
    The roots phase (pool prefill and root rollouts) is common to both and included in both.
    """
    m = num_prompts * roots_per_prompt
    pool = question_pool(env, np.arange(num_prompts))
    slots = jnp.repeat(jnp.arange(num_prompts, dtype=jnp.int32), roots_per_prompt)
    sampling = SamplingConfig()

    def roots(mdl, key):
        ro = ex.start_roots(mdl, env, pool, ex.prefill_pool(mdl, pool), slots, jax.random.split(key, m),
                            pad_id=protocol.PAD)
        return run_turns(mdl, env, ro, sampling=sampling)

    ro = jit_with_model(roots)(model, jax.random.key(seed))
    rt = jax.device_get(ro.tree)
    anchors = [(s, t) for s in range(m) for t in range(int(rt.num_turns[s]) - 1)]
    rng = np.random.default_rng(seed)
    picks = [anchors[i] for i in rng.integers(0, len(anchors), m * n)]
    parent, turn = (jnp.asarray(x, jnp.int32) for x in zip(*picks))
    keys = jax.random.split(jax.random.key(seed + 1), m * n)
    cut = rt.boundaries[np.asarray(parent), np.asarray(turn)]
    width = int(cut.max())

    def forks(mdl, ro, parent, turn, keys):
        return run_turns(mdl, env, ex.fork(mdl, env, ro, parent, turn, keys, pad_id=protocol.PAD), sampling=sampling)

    def reprefill(mdl, ro, parent, turn, keys):
        cont = ex.restart(mdl, env, ro, parent, turn, keys, width=width, pad_id=protocol.PAD)
        return run_turns(mdl, env, cont, sampling=sampling)

    forks, reprefill = jit_with_model(forks).bind(model), jit_with_model(reprefill).bind(model)
    # each timed call's rollout is kept without its KV cache (all of a call's outputs are ready at once)
    t = alternate({"fork": lambda: dataclasses.replace(forks(ro, parent, turn, keys), cache=None),
                   "reprefill": lambda: dataclasses.replace(reprefill(ro, parent, turn, keys), cache=None)}, repeats)
    fork_times, fork_compile, re_times = t["fork"].times, t["fork"].compile_s, t["reprefill"].times
    cont, re_cont = jax.device_get(t["fork"].outputs[-1]), jax.device_get(t["reprefill"].outputs[-1])
    common_processed = int(ro.fed_positions)  # pool prefill and root rollouts
    common_useful = int(pool.lengths.sum()) + int(rt.model_tokens.sum())
    return {
        "slot_len_fork": cont.tree.max_len, "slot_len_reprefill": re_cont.tree.max_len,
        "processed_fork": common_processed + int(cont.fed_positions),
        "processed_reprefill": common_processed + int(re_cont.fed_positions),
        "useful_fork": common_useful + int(cont.tree.model_tokens.sum()),
        "useful_reprefill": common_useful + int(cut.sum()) + int(re_cont.tree.model_tokens.sum()),
        "time_fork": fork_times, "time_reprefill": re_times,
        "time_ratio": float(np.median(re_times) / np.median(fork_times)),
        "compile_fork": fork_compile,
        "utilisation_roots": float(ro.live_tokens / (m * ro.decode_steps)),
        "utilisation_continuations": float(cont.live_tokens / (cont.tree.num_slots * cont.decode_steps)),
    }


def update_packed_vs_unpacked(model: Policy, env: HopWorldEnv, num_prompts: int, roots_per_prompt: int, n: int,
                              block: int, repeats: int = 3, seed: int = 0) -> dict[str, object]:
    """The update (loss forward and backward, `train.step.tree_grads`) of one uniform tree, unpacked and packed,
    taking turns (`alternate`). Packed into one row just long enough for this tree, its slots' tokens in blocks of
    `block`."""
    plan = Plan(Allocator("uniform_tree", group_size=roots_per_prompt), roots=num_prompts * roots_per_prompt,
                continuations=n)
    sampling = SamplingConfig()
    tree, _, _ = ex.expand_tree(model, env, question_pool(env, np.arange(num_prompts)), jax.random.key(seed),
                                plan=plan, sampling=sampling, pad_id=protocol.PAD)
    row_len = int(prompt_sizes(tree, block).sum())
    graphdef, params = nnx.split(model)
    unpacked = StepSpec(plan=plan, sampling=sampling, clip_eps=0.2, kl_coef=0.0, predictor_coef=1.0,
                        pad_id=protocol.PAD)
    packed = dataclasses.replace(unpacked, pack_rows=1, pack_len=row_len, pack_block=block)
    grads = {name: jax.jit(lambda params, tree, spec=spec: tree_grads(graphdef, spec, params, None, tree))
             for name, spec in (("unpacked", unpacked), ("packed", packed))}
    timed = alternate({name: functools.partial(fn, params, tree) for name, fn in grads.items()}, repeats)
    aux = timed["packed"].outputs[-1][1]
    assert not bool(aux["pack_overflow"]), "sized to this tree, the packing cannot overflow"
    return {"positions_unpacked": tree.tokens.size, "positions_packed": int(aux["update_positions"]),
            "real_tokens": int(tree.length.sum()),
            "canonical_tokens": int(prompt_sizes(tree, 1).sum()),
            "time_unpacked": timed["unpacked"].times, "time_packed": timed["packed"].times,
            "time_ratio": float(np.median(timed["packed"].times) / np.median(timed["unpacked"].times))}


def expansion_sync_vs_refill(model: Policy, env: HopWorldEnv, plan: Plan, live_slots: int, num_prompts: int,
                             repeats: int = 3, seed: int = 0) -> dict[str, object]:
    """One step's expansion by the synchronous engine and by slot refill on live_slots rows, taking turns
    (`alternate`), under the same key (the same tree, checked). Positions as in `tree_fork_vs_reprefill`."""
    pool = question_pool(env, np.arange(num_prompts))
    kwargs = dict(plan=plan, sampling=SamplingConfig(), pad_id=protocol.PAD)
    sync, refilled = ex.expand_tree.bind(model), refill.expand_refilled.bind(model)
    key = jax.random.key(seed)
    t = alternate({"sync": lambda: sync(env, pool, key, **kwargs),
                   "refill": lambda: refilled(env, pool, key, live_slots=live_slots, **kwargs)}, repeats)
    out = {}
    for name, timed in t.items():
        tree, _, stats = timed.outputs[-1]
        out[name] = {"time": timed.times, "compile": timed.compile_s, "tree": jax.device_get(tree),
                     **{k: float(v) for k, v in stats.items()}}
    a, b = out["sync"]["tree"], out["refill"]["tree"]
    assert all(np.array_equal(x, y) for x, y in zip((a.tokens, a.length, a.parent), (b.tokens, b.length, b.parent))), \
        "slot refill sampled a different tree under the same key"
    out["useful"] = int(pool.lengths.sum()) + int(a.model_tokens.sum())
    out["time_ratio"] = float(np.median(out["sync"]["time"]) / np.median(out["refill"]["time"]))
    return out


def hopworld_policy(checkpoint: str | None) -> tuple[Policy, str]:
    """(the HopWorld-size policy, which one it is): the checkpoint's, else a random one of the same size. The tokens/s
    table does not depend on the weights; the tree, expansion and update sections do (episode lengths)."""
    if checkpoint and Path(checkpoint).exists():
        from trace_jax.checkpoints import load_model
        return load_model(checkpoint), checkpoint
    return init_policy(SFTConfig().model, seed=0), (f"a random init of the same size (no checkpoint at {checkpoint}: "
                                                    "`trace-jax sft` builds the SFT base policy)")


def in_dtype(model: Policy, dtype: str) -> Policy:
    """`model` with its weights rounded to `dtype` and computing in it (through an HF checkpoint, as transformers
    loads the same weights)."""
    if model.cfg.dtype == dtype and model.cfg.param_dtype == dtype:
        return model
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, d)
        return from_pretrained(d, dtype=dtype)


def run_sampler_bench(checkpoint: str | None, batch: int, prompt_len: int, steps: int, mid_batch: int,
                      skip_mid: bool, repeats: int, dtype: str = "float32") -> None:
    """dtype: of both sides of the throughput table (the tree, expansion and update sections run the HopWorld
    policy as it is)."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    policy, which = hopworld_policy(checkpoint)
    sizes = [("hopworld", policy, batch)] + ([] if skip_mid else [("mid-size", init_policy(MID_SIZE, 0), mid_batch)])
    print(f"sampler: {prompt_len}-token prompts, {steps} sampled tokens per row (temperature 1), {dtype}; "
          f"{repeats} timed runs per side after a warm-up, the sides taking turns, median [min-max]")
    print(f"threads: ours XLA CPU on {os.cpu_count()} cores ({jax.device_count()} host devices), transformers "
          f"torch.get_num_threads()={torch.get_num_threads()}")
    print(f"HopWorld-size policy: {which}")
    print("  ours: the prompts' prefill and the decode loop, as transformers' generate, with the model split once "
          "(as a training step holds it); decode: the loop alone (each run times the two apart). GFLOP/s: the decode "
          f"loop at the useful FLOPs of the tokens it feeds, {steps - 1} a row (a turn's last token waits for the "
          "observation's forward, as generate never feeds its last): projections, output "
          "head, attention over the tokens before it; dot: a jitted matmul [batch, hidden] x [hidden, MLP width] as "
          "the model runs its matmuls (qwen3.matmul: jnp.dot in float32), this machine's matmul limit at a decode "
          "step's shapes, measured in this run")
    print("  draw: how ours draws a token (train.draw): gumbel, the default (the tokens of jax.random.categorical), "
          "or inverse_cdf (one uniform a row); HF and dot are one measurement per model, taking turns with all sides")
    print("  devices: 1, XLA:CPU's one device, its ops threaded over the cores; more (--host-devices), the rows split "
          "over that many host devices as a mesh splits a step's slots (sharding.constrain_rows), each device "
          "decoding its share")
    print(f"{'model':>10} {'params':>8} {'batch':>6} {'draw':>12} {'devices':>7} {'ours tok/s':>22} {'HF tok/s':>22} "
          f"{'ratio':>6} {'compile s':>10} {'decode tok/s':>22} {'GFLOP/s':>8} {'dot':>7} {'of dot':>7}")
    for name, model, b in sizes:
        model = in_dtype(model, dtype)
        params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        r = sampler_vs_transformers(model, b, prompt_len, steps, repeats, mesh=host_mesh(b))
        theirs, limit = r["transformers"], np.median(r["dot"])
        per_token = decode_flops_per_token(model.cfg, prompt_len + steps // 2)
        for side in r["ours"]:
            ours, decode = r["ours"][side], r["decode"][side]
            ratio = np.median(ours) / np.median(theirs)
            flops = np.median(decode) * (steps - 1) / steps * per_token  # fed tokens/s x FLOPs of each
            print(f"{name:>10} {params / 1e6:7.1f}M {b:>6} {side[0]:>12} {side[1]:>7} {_rate(ours):>22} "
                  f"{_rate(theirs):>22} {ratio:6.2f} {r['compile'][side]:10.1f} {_rate(decode):>22} "
                  f"{flops / 1e9:8.2f} {limit / 1e9:7.2f} {100 * flops / limit:6.1f}%")

    print(f"\ndraw: the token draw alone from {batch} rows of float32 logits (temperature 1), per draw, the draws "
          "taking turns: jax.random.categorical (vmapped), ours (gumbel: the same tokens; the default) and inverse_cdf")
    print(f"{'vocab':>7} {'draws':>6} {'jax.random ms':>22} {'gumbel ms':>22} {'inverse_cdf ms':>22} "
          f"{'gumbel vs jax':>14} {'inverse_cdf vs gumbel':>22}")
    for vocab in (policy.cfg.vocab_size, MID_SIZE.vocab_size, PRESETS["qwen3-8b"].vocab_size):
        t, calls = draws_alone(batch, vocab, repeats)
        ms = {name: 1e3 * timed.times / calls for name, timed in t.items()}
        print(f"{vocab:>7} {calls:>6} " + " ".join(f"{spread(ms[name]):>22}" for name in DRAW_SIDES) +
              f" {np.median(ms['jax.random']) / np.median(ms['gumbel']):13.2f}x "
              f"{np.median(ms['gumbel']) / np.median(ms['inverse_cdf']):21.2f}x")

    wcfg = HopWorldConfig(max_hops=2, max_turns=3, num_questions=512)
    env = HopWorldEnv(build_world(wcfg), wcfg)
    print(f"\ntree: 3-turn HopWorld episodes (max_hops=2, max_turns=3), forks vs re-prefilling each continuation, "
          f"both in slots of length {max_len(wcfg.prompt_len, TurnSpec.of(env))}")
    print("  processed = rows x positions of every forward (padding, idle slots included); useful = real tokens")
    print(f"{'N':>3} {'processed fork':>15} {'re-prefill':>11} {'useful fork':>12} {'re-prefill':>11} "
          f"{'time fork s':>22} {'re-prefill s':>22} {'speedup':>8} {'util roots':>11} {'util cont':>10}")
    for n in (2, 6):
        r = tree_fork_vs_reprefill(policy, env, num_prompts=8, roots_per_prompt=4, n=n, repeats=repeats)
        print(f"{n:>3} {r['processed_fork']:>15} {r['processed_reprefill']:>11} {r['useful_fork']:>12} "
              f"{r['useful_reprefill']:>11} {spread(r['time_fork']):>22} {spread(r['time_reprefill']):>22} "
              f"{r['time_ratio']:7.2f}x {100 * r['utilisation_roots']:10.1f}% "
              f"{100 * r['utilisation_continuations']:9.1f}%")

    cfg = TrainConfig()
    world = HopWorldEnv(build_world(cfg.world), cfg.world)
    plan = Plan(Allocator(cfg.allocator), roots=cfg.roots, continuations=cfg.continuations)
    slots = plan.roots * (1 + plan.continuations)
    print(f"\nexpansion: one step of the default run ({cfg.allocator}, pool B={cfg.pool_size}, M={plan.roots}, "
          f"N={plan.continuations}: {slots} slots, default world), synchronous turns over all slots vs slot refill on "
          "S_live rows, the same tree (checked)")
    print("  utilisation = sampled tokens / (rows x decode steps); processed and useful positions as above")
    print(f"{'S_live':>6} {'util sync':>10} {'refill':>7} {'steps sync':>11} {'refill':>7} {'processed sync':>15} "
          f"{'refill':>7} {'useful':>7} {'time sync s':>22} {'refill s':>22} {'speedup':>8}")
    for live in (4, 8, plan.roots):
        r = expansion_sync_vs_refill(policy, world, plan, live, cfg.pool_size, repeats=repeats)
        a, b = r["sync"], r["refill"]
        print(f"{live:>6} {100 * a['utilisation']:9.1f}% {100 * b['utilisation']:6.1f}% {a['decode_steps']:>11.0f} "
              f"{b['decode_steps']:>7.0f} {a['fed_positions']:>15.0f} {b['fed_positions']:>7.0f} {r['useful']:>7} "
              f"{spread(a['time']):>22} {spread(b['time']):>22} {r['time_ratio']:7.2f}x")

    print("\nupdate: the loss forward and backward of one uniform tree (8 prompts x 2 roots x N), every slot its "
          "own row (unpacked, S x L positions) vs each distinct token once (packed: one row as long as the tree "
          "needs, each slot's tokens from a block of Bk)")
    print(f"{'N':>3} {'Bk':>3} {'positions':>10} {'packed':>7} {'ratio':>6} {'real':>6} "
          f"{'distinct':>9} {'time unpacked s':>22} {'packed s':>22} {'ratio':>6}")
    for n in (2, 6):
        block = StepSpec.pack_block
        r = update_packed_vs_unpacked(policy, env, num_prompts=8, roots_per_prompt=2, n=n, block=block,
                                      repeats=repeats)
        print(f"{n:>3} {block:>3} {r['positions_unpacked']:>10} {r['positions_packed']:>7} "
              f"{r['positions_packed'] / r['positions_unpacked']:6.2f} {r['real_tokens']:>6} "
              f"{r['canonical_tokens']:>9} {spread(r['time_unpacked']):>22} {spread(r['time_packed']):>22} "
              f"{r['time_ratio']:6.2f}")


def _rate(rates: np.ndarray) -> str:
    return f"{np.median(rates):.0f} [{rates.min():.0f}-{rates.max():.0f}]"
