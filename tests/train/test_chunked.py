"""Budgets larger than memory: a step rolled out and backpropagated in chunks of whole prompts is the whole step
under the same key (the same trees; loss, gradients and metrics within 1e-5)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from toy import make_tree, tiny_env, trained_policy_state
from trace_jax.allocation import Allocator, Plan
from trace_jax.config import TrainConfig, load_config
from trace_jax.envs.hopworld import protocol
from trace_jax.envs.hopworld.host import HopWorldHost
from trace_jax.evaluate import question_pool
from trace_jax.rollout.chunks import check_chunk, chunk_bounds, expand_in_chunks
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import expand_tree
from trace_jax.rollout.host import rollout_host_chunk
from trace_jax.rollout.tree import Tree
from trace_jax.train.chunked import ChunkedStep
from trace_jax.train.loop import warm_up
from trace_jax.train.step import StepSpec, TrainState, make_optimizer, tree_grads, tree_metrics
from trace_jax.train.steps import make_step
from float32 import assert_float32_close, tree_scale

N = 2


def test_chunk_bounds_keep_prompts_whole():
    prompt = np.array([0, 0, 1, 1, 1, 3, 3, 4, 4, 4])
    assert chunk_bounds(prompt, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert chunk_bounds(prompt, 5) == [(0, 5), (5, 10)]
    assert chunk_bounds(prompt, 10) == [(0, 10)]
    with pytest.raises(ValueError, match="prompt 1 has 3 root rollouts, more than a chunk's 2"):
        chunk_bounds(prompt, 2)


@pytest.mark.parametrize("allocator", [Allocator("trace", max_per_anchor=3), Allocator("uniform_tree", group_size=2),
                                       Allocator("random_tree", group_size=2)])
def test_a_chunk_of_whole_prompts_gets_the_whole_steps_stage_2(allocator):
    """Each chunk's continuations per anchor are the whole step's rows, for the deterministic solver and for the
    random rules, whose noise the chunk reads at its window of the step's draw."""
    rng = np.random.default_rng(0)
    prompt = np.array([0, 0, 1, 1, 1, 3, 3, 4, 4, 4])  # prompts 2 and 5 of the pool got no roots
    m = np.bincount(prompt, minlength=6)
    turns = rng.integers(1, 4, len(prompt))
    success = np.where(np.arange(4) <= turns[:, None], rng.uniform(size=(len(prompt), 4)), Tree.NO_READING)
    roots = make_tree(prompt, turns, rng.integers(0, 2, len(prompt)), success=success)
    key = jax.random.key(3)
    k_all, unplaced_all = allocator.prefixes(key, roots, jnp.asarray(m), N)
    assert int(k_all.sum()) > 0
    r = 4
    for lo, hi in chunk_bounds(prompt, r):
        own = np.arange(r) < hi - lo
        rows = np.minimum(lo + np.arange(r), len(prompt) - 1)
        chunk = jax.tree.map(lambda a, rows=rows: a[rows], roots)
        chunk = dataclasses.replace(chunk, prompt=jnp.where(own, chunk.prompt, Tree.NO_PROMPT))
        m_chunk = np.bincount(prompt[lo:hi], minlength=6)
        k, unplaced = allocator.prefixes(key, chunk, jnp.asarray(m_chunk), N, first_root=lo, all_roots=len(prompt))
        np.testing.assert_array_equal(np.asarray(k)[: hi - lo], np.asarray(k_all)[lo:hi])
        assert not np.asarray(k)[hi - lo:].any()
        in_chunk = m_chunk > 0
        np.testing.assert_array_equal(np.asarray(unplaced)[in_chunk], np.asarray(unplaced_all)[in_chunk])


TREE_FIELDS = ("tokens", "policy_mask", "length", "prompt_len", "boundaries", "num_turns", "prompt", "question",
               "parent", "branch_turn", "done", "reward", "model_tokens")


def assert_same_tree(a: Tree, b: Tree) -> None:
    used = np.asarray(a.used)
    np.testing.assert_array_equal(used, np.asarray(b.used))
    for name in TREE_FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(a, name))[used], np.asarray(getattr(b, name))[used],
                                      err_msg=name)
    for name in ("logprobs", "success"):
        np.testing.assert_allclose(np.asarray(getattr(a, name))[used], np.asarray(getattr(b, name))[used],
                                   atol=1e-5, err_msg=name)


def test_chunked_step_equals_the_whole_step():
    """Uniform trees at M=8, N=2 (24 slots) in chunks of 12 slots, with a KL term and temperature 0.8: the same
    tree as `expand` (with the environment in JAX or on the host), loss and gradients of the whole tree within
    1e-5, the same metrics, and the same predictor warm-up. (The plan, pool and sampling of test_warmup's
    expansion: one compilation for both.)"""
    graphdef, params = trained_policy_state()
    params = jax.tree.map(jnp.copy, params)
    tx = make_optimizer(1e-3, 1.0, head_learning_rate=1e-2)
    state = TrainState(params=params, opt_state=tx.init(params), ref_params=jax.tree.map(jnp.copy, params),
                       step=jnp.zeros((), jnp.int32))
    spec = StepSpec(plan=Plan(Allocator("uniform_tree", group_size=2), roots=8, continuations=N),
                    sampling=SamplingConfig(0.8), clip_eps=0.2, kl_coef=0.1, predictor_coef=1.0, pad_id=protocol.PAD)
    env, key = tiny_env(), jax.random.key(5)
    pool = question_pool(env, np.arange(8))
    model = nnx.merge(graphdef, params)

    whole, pool_v, stats = expand_tree(model, env, pool, key, plan=spec.plan, sampling=spec.sampling,
                                       pad_id=spec.pad_id)
    tree, pool_v_c, _, chunks = expand_in_chunks(model, env, pool, key, plan=spec.plan, chunk_slots=12,
                                                 sampling=spec.sampling, pad_id=spec.pad_id)
    assert len(chunks) == 2 and all(c.tree.num_slots == 12 for c in chunks)
    assert int(whole.is_continuation.sum()) == 16  # stage 2 placed every continuation, across both chunks
    assert_same_tree(whole, tree)
    np.testing.assert_allclose(pool_v, pool_v_c, atol=1e-6)
    # with the environment on the host (search QA's path), chunk by chunk: the same tree again
    host_tree, _, _, _ = expand_in_chunks(model, HopWorldHost(env), pool, key, plan=spec.plan, chunk_slots=12,
                                          sampling=spec.sampling, pad_id=spec.pad_id, run_chunk=rollout_host_chunk)
    assert_same_tree(whole, host_tree)

    @jax.jit
    def reference(state, tree):
        loss, aux, grads = tree_grads(graphdef, spec, state.params, state.ref_params, tree)
        return loss, aux, grads, tree_metrics(spec, tree, pool, pool_v, stats)

    loss, aux, grads, metrics_ref = reference(state, whole)
    step = make_step(graphdef, tx, spec, chunk_slots=12)
    assert isinstance(step, ChunkedStep)
    loss_c, aux_c, grads_c = step.accumulate(state.params, state.ref_params, chunks)
    assert_float32_close(loss_c, loss, scale=1.0)  # O(1) quantities, some near 0 (a KL of 4e-9)
    for k in aux:
        assert_float32_close(aux_c[k], aux[k], scale=1.0, err_msg=k)
    scale = max(tree_scale(grads), 1.0)  # the gradient of an O(1) loss: its terms' size, not each tensor's
    for a, b in zip(jax.tree.leaves(grads_c), jax.tree.leaves(grads)):  # sums over chunks, then over them
        assert_float32_close(a, b, scale=scale)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-3  # not a vanishing gradient

    new, metrics = step(state, env, pool, key)
    assert int(new.step) == 1 and not bool(metrics["skipped"])
    np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(grads), rtol=1e-5)
    for k, v in dict(metrics_ref, **aux, loss=loss).items():
        if k not in ("fed_positions", "utilisation"):  # chunks prefill their roots' rows and idle differently
            np.testing.assert_allclose(metrics[k], v, atol=1e-5, err_msg=k)

    # the predictor warm-up of a run with chunk_slots rolls out the same uniform trees, chunk by chunk, as one
    # rolling them out whole: synchronously (refill_slots=0), with `whole`'s program (its plan, pool shape and
    # sampling); the refilled rows of the default are the synchronous tree (tests/rollout/test_refill.py)
    cfg = load_config(TrainConfig, None, ["roots=8", f"continuations={N}", "temperature=0.8", "warmup.batches=2",
                                          "warmup.fit_steps=20", "max_roots_per_prompt=4", "refill_slots=0"])
    pools = lambda i: question_pool(env, np.arange(8 * i, 8 * i + 8))
    fresh = lambda: nnx.merge(graphdef, jax.tree.map(jnp.copy, trained_policy_state()[1]))  # params was donated
    report = warm_up(cfg, fresh(), env, pools, protocol.PAD)
    chunked = warm_up(dataclasses.replace(cfg, chunk_slots=12), fresh(), env, pools, protocol.PAD)
    assert report.keys() == chunked.keys()
    for k, v in report.items():
        np.testing.assert_allclose(chunked[k], v, atol=1e-5, err_msg=k)


def test_a_chunk_too_small_for_one_prompt_fails_before_any_work():
    with pytest.raises(ValueError, match=r"chunk_slots=8 cannot hold one prompt's tree: trace may give a prompt 3 "
                                         r"root rollouts, each with N=2 continuations, 9 slots"):
        check_chunk(Plan(Allocator("trace", max_roots=3), roots=8, continuations=2), 8)
    with pytest.raises(ValueError, match="raise chunk_slots to at least 12"):
        check_chunk(Plan(Allocator("grpo", group_size=4), roots=16, continuations=2), 11)
    assert check_chunk(Plan(Allocator("grpo", group_size=4), roots=16, continuations=0), 9) == 9
    # on 8 data-parallel devices: 30 slots hold 10 roots x 3, rounded down to 8 so each device rolls out one
    assert check_chunk(Plan(Allocator("uniform_tree", group_size=2), roots=16, continuations=2), 30, 8) == 8
    with pytest.raises(ValueError, match=r"27 slots; raise chunk_slots to at least 48 \(chunks hold a multiple of 8"):
        check_chunk(Plan(Allocator("uniform_tree", group_size=9), roots=18, continuations=2), 27, 8)
    with pytest.raises(ValueError, match="max_roots_per_prompt must be 0"):
        load_config(TrainConfig, None, ["max_roots_per_prompt=1"])
    with pytest.raises(ValueError, match="chunk_slots must be >= 0"):
        load_config(TrainConfig, None, ["chunk_slots=-4"])
    with pytest.raises(ValueError, match=r"chunk_slots=24 cannot hold trace's largest prompt \(16 roots x 3 slots\) "
                                         r"= 48 slots; raise chunk_slots to at least 48 or set max_roots_per_prompt"):
        load_config(TrainConfig, None, ["chunk_slots=24"])  # the defaults: M=16, N=2, TRACE roots uncapped
    with pytest.raises(ValueError, match=r"a warm-up prompt \(4 roots x 3 slots\) = 12 slots"):
        load_config(TrainConfig, None, ["chunk_slots=9", "max_roots_per_prompt=3", "warmup.group_size=4"])
    assert load_config(TrainConfig, None, ["chunk_slots=9", "max_roots_per_prompt=3"]).chunk_slots == 9
