"""Tree expansion: forks copy instead of recomputing, continuations replay fresh rollouts, static shapes."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from flax import nnx
from hypothesis import strategies as st

from trace_jax import sharding as shd
from trace_jax.config import MeshConfig
from trace_jax.envs.hopworld import HopWorldConfig, build_world, protocol
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.envs.hopworld.vocab import VOCAB_SIZE
from trace_jax.evaluate import question_pool
from trace_jax.models import ModelConfig
from trace_jax.rollout import expand as ex
from trace_jax.rollout.engine import SamplingConfig, run_turns
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import init_policy

CFG = ModelConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=16, rope_theta=1e4)
WCFG = HopWorldConfig(seed=2, num_entities=64, num_questions=40, max_turns=5)
SAMPLING = SamplingConfig(temperature=1.0)
B, M, N = 4, 8, 2


@pytest.fixture(scope="module")
def env():
    return HopWorldEnv(build_world(WCFG), WCFG)


@pytest.fixture(scope="module")
def model():
    return init_policy(CFG, seed=0)


def two_roots_each(key, v):
    """Uniform roots: every pool prompt gets M // B slots."""
    del key
    return jnp.repeat(jnp.arange(v.shape[0], dtype=jnp.int32), M // v.shape[0])


def random_anchors(key, tree: Tree):
    """Each continuation slot picks a uniformly random valid anchor of a random root (or -1)."""
    valid = jnp.arange(tree.boundaries.shape[1])[None] < (tree.num_turns - 1)[:, None]  # [R, T]
    flat = valid.reshape(-1)
    logits = jnp.where(flat, 0.0, -jnp.inf)
    pick = jax.random.categorical(key, logits, shape=(M * N,))
    any_valid = flat.any()
    parent = jnp.where(any_valid, pick // valid.shape[1], -1).astype(jnp.int32)
    turn = jnp.where(any_valid, pick % valid.shape[1], -1).astype(jnp.int32)
    return parent, turn


@functools.partial(jax.jit, static_argnames="graphdef")
def _roots_phase(graphdef, state, env, pool, prompt_of_slot, key):
    model = nnx.merge(graphdef, state)
    cache, logits, v = ex.prefill(model, pool.tokens, pool.lengths, pool.tokens.shape[1])
    ro = ex.start_roots(model, env, pool, prompt_of_slot, jax.random.split(key, prompt_of_slot.shape[0]),
                        cache, logits, v, protocol.PAD)
    return run_turns(model, env, ro, SAMPLING)


@functools.partial(jax.jit, static_argnames="graphdef")
def _fork_phase(graphdef, state, env, roots, parent, branch_turn, keys):
    model = nnx.merge(graphdef, state)
    cont = ex.fork(env, model, roots, parent, branch_turn, keys, protocol.PAD)
    return run_turns(model, env, cont, SAMPLING)


def test_fork_processes_only_new_tokens(env, model):
    pool = question_pool(env, np.arange(B))
    tree, _, _ = ex.expand_tree(model, env, pool, jax.random.key(0), two_roots_each, random_anchors, SAMPLING,
                             protocol.PAD)
    tree = jax.device_get(tree)
    roots, conts = slice(0, M), slice(M, None)
    assert (tree.parent[roots] == -1).all()
    parent, b = tree.parent[conts], tree.branch_turn[conts]
    assert (parent >= 0).all()
    cut = tree.boundaries[parent, b]
    # Independent count from the tree's token layout: a root's own tokens after its prompt,
    # a continuation's tokens after its anchor. Prompts were prefilled once, in the pool.
    expected = (tree.length[roots] - tree.prompt_len[roots]).sum() + (tree.length[conts] - cut).sum()
    assert tree.model_tokens.sum() == expected
    reprefill = tree.length.sum()  # every slot recomputed from its first token
    assert tree.model_tokens.sum() + int(pool.lengths.sum()) < reprefill


def test_forked_continuation_equals_fresh_rollout_of_its_prefix(env, model):
    state = nnx.split(model)
    pool = question_pool(env, np.arange(B))
    roots = _roots_phase(*state, env, pool, jnp.repeat(jnp.arange(B, dtype=jnp.int32), M // B),
                         jax.random.key(1))
    rt = jax.device_get(roots.tree)
    anchors = [(s, t) for s in range(M) for t in range(int(rt.num_turns[s]) - 1)][:M]
    assert len(anchors) >= 4
    parent = np.full(M, -1, np.int32)
    turn = np.full(M, -1, np.int32)
    parent[: len(anchors)], turn[: len(anchors)] = zip(*anchors)
    keys = jax.random.split(jax.random.key(7), M)
    forked = jax.device_get(_fork_phase(*state, env, roots, jnp.asarray(parent), jnp.asarray(turn), keys).tree)

    # Fresh: the prefix becomes a prompt that is prefilled from scratch; same per-slot keys.
    n = len(anchors)
    fresh = jax.device_get(_fresh(*state, env, roots, jnp.asarray(parent[:n]), jnp.asarray(turn[:n]), keys[:n]))
    for i in range(n):
        length = int(forked.length[i])
        assert length == int(fresh.length[i])
        np.testing.assert_array_equal(forked.tokens[i, :length], fresh.tokens[i, :length])
        assert forked.reward[i] == fresh.reward[i]


@functools.partial(jax.jit, static_argnames="graphdef")
def _fresh(graphdef, state, env, roots, parent, turn, keys):
    model = nnx.merge(graphdef, state)
    ro = ex.restart(env, model, roots, parent, turn, keys, roots.tree.max_len, protocol.PAD)
    return run_turns(model, env, ro, SAMPLING).tree


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_tree_invariants_under_random_allocations(env, model, data):
    state = nnx.split(model)
    counts = data.draw(st.lists(st.integers(0, M), min_size=B, max_size=B).filter(lambda c: sum(c) == M)
                       | st.just([M, 0, 0, 0]))
    prompt_of_slot = np.repeat(np.arange(B), counts).astype(np.int32)
    pool = question_pool(env, np.array(data.draw(st.lists(st.integers(0, 39), min_size=B, max_size=B))))
    roots = _roots_phase(*state, env, pool, jnp.asarray(prompt_of_slot), jax.random.key(data.draw(st.integers(0, 99))))
    rt = jax.device_get(roots.tree)
    anchors = [(s, t) for s in range(M) for t in range(int(rt.num_turns[s]) - 1)]
    picks = data.draw(st.lists(st.sampled_from(anchors) if anchors else st.nothing(), max_size=M * N))
    parent = np.full(M * N, -1, np.int32)
    turn = np.full(M * N, -1, np.int32)
    if picks:
        parent[: len(picks)], turn[: len(picks)] = zip(*picks)
    cont = jax.device_get(_fork_phase(*state, env, roots, jnp.asarray(parent), jnp.asarray(turn),
                                      jax.random.split(jax.random.key(3), M * N)).tree)
    tree = jax.tree.map(lambda a, b: np.concatenate([a, b]), rt, cont)
    for s in range(tree.num_slots):
        if tree.prompt[s] < 0:  # unused capacity is inert
            assert tree.done[s] and tree.length[s] == 0 and not tree.policy_mask[s].any()
            assert (tree.tokens[s] == protocol.PAD).all() and tree.reward[s] == 0
            continue
        n = int(tree.num_turns[s])
        bounds = tree.boundaries[s, :n]
        assert (np.diff(np.r_[tree.prompt_len[s], bounds]) > 0).all() and (tree.boundaries[s, n:] == -1).all()
        assert bounds[-1] == tree.length[s] and tree.done[s]
        assert not tree.policy_mask[s, tree.length[s]:].any()
        assert not tree.policy_mask[s, : tree.prompt_len[s]].any()
        if s >= M:
            p, b = tree.parent[s], tree.branch_turn[s]
            assert p < M and tree.parent[p] == -1 and tree.prompt[p] == tree.prompt[s]
            cut = tree.boundaries[p, b]
            np.testing.assert_array_equal(tree.tokens[s, :cut], tree.tokens[p, :cut])
            np.testing.assert_array_equal(tree.policy_mask[s, :cut], tree.policy_mask[p, :cut])
            np.testing.assert_array_equal(tree.boundaries[s, : b + 1], tree.boundaries[p, : b + 1])
        # each turn: policy tokens first, then observation tokens only
        start = tree.prompt_len[s]
        for end in bounds:
            m = tree.policy_mask[s, start:end]
            k = int(m.sum())
            assert k >= 1 and m[:k].all() and not m[k:].any()
            start = end


def test_expansion_compiles_once_for_ten_steps(env, model):
    before = ex._expand_jit._cache_size()
    for step in range(10):
        pool = question_pool(env, np.arange(step, step + B))
        tree, _, _ = ex.expand_tree(model, env, pool, jax.random.key(step), two_roots_each, random_anchors,
                                 SAMPLING, protocol.PAD)
    jax.block_until_ready(tree)
    assert ex._expand_jit._cache_size() - before <= 1


def test_sharded_slots_give_the_same_tree(env, model):
    pool = question_pool(env, np.arange(B))
    single, _, _ = ex.expand_tree(model, env, pool, jax.random.key(5), two_roots_each, random_anchors, SAMPLING,
                               protocol.PAD)
    mesh = shd.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:4])
    sharded_model = init_policy(CFG, seed=0, mesh=mesh)
    rows = functools.partial(shd.batch_sharding, mesh=mesh)
    sharded_pool = ex.Pool(*(jax.device_put(a, rows(a.shape)) for a in (pool.tokens, pool.lengths, pool.question)))
    assert len(sharded_pool.tokens.sharding.device_set) == 4
    sharded, _, _ = ex.expand_tree(sharded_model, env, sharded_pool, jax.random.key(5), two_roots_each,
                                random_anchors, SAMPLING, protocol.PAD)
    for a, b in zip(jax.tree.leaves(jax.device_get(single)), jax.tree.leaves(jax.device_get(sharded))):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_degenerate_budgets(env, model):
    pool = question_pool(env, np.arange(B))
    one_prompt = lambda key, v: jnp.zeros((M,), jnp.int32)  # noqa: E731  a prompt given every slot
    tree, _, _ = ex.expand_tree(model, env, pool, jax.random.key(2), one_prompt, ex.no_prefixes, SAMPLING,
                             protocol.PAD)  # N = 0
    tree = jax.device_get(tree)
    assert tree.num_slots == M and (tree.prompt == 0).all() and tree.done.all()
    # max turns reached without an answer: the untrained policy rarely answers
    cut_off = tree.num_turns == WCFG.max_turns
    assert cut_off.any() and (tree.reward[cut_off] == 0).all()

    def no_anchor(key, tree):  # e.g. every episode ended at turn 1: nothing to fork from
        return jnp.full((M * N,), -1, jnp.int32), jnp.full((M * N,), -1, jnp.int32)

    tree, _, _ = ex.expand_tree(model, env, pool, jax.random.key(2), two_roots_each, no_anchor, SAMPLING,
                             protocol.PAD)
    tree = jax.device_get(tree)
    assert (tree.prompt[M:] == -1).all() and tree.done.all() and (tree.model_tokens[M:] == 0).all()


def test_impossible_allocations_fail_clearly(env, model):
    state = nnx.split(model)
    pool = question_pool(env, np.arange(B))
    cache, logits, v = ex.prefill(model, pool.tokens, pool.lengths, pool.tokens.shape[1])
    with pytest.raises(ValueError, match="prompt_of_slot has entries outside"):
        ex.start_roots(model, env, pool, jnp.array([0, 1, 9, 2]), jax.random.split(jax.random.key(0), 4),
                       cache, logits, v, protocol.PAD)
    roots = _roots_phase(*state, env, pool, jnp.repeat(jnp.arange(B, dtype=jnp.int32), M // B), jax.random.key(1))
    with pytest.raises(ValueError, match="non-final turn"):
        ex.fork(env, model, roots, jnp.array([0]), jnp.array([WCFG.max_turns]), jax.random.split(jax.random.key(0), 1),
                protocol.PAD)
