"""Tree expansion: forks copy instead of recomputing, continuations replay fresh rollouts, static shapes."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toy import TINY_POLICY, TINY_WORLD, tiny_env, trained_policy
from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.config import MeshConfig
from trace_jax.envs.hopworld import protocol
from trace_jax.evaluate import question_pool
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout import expand as ex
from trace_jax.rollout.engine import SamplingConfig, run_turns
from trace_jax.rollout.sampling import token_logprobs
from trace_jax.sharding import init_policy

SAMPLING = SamplingConfig(temperature=1.0)
B, M, N = 4, 8, 2
PLAN = Plan(Allocator("random_tree", group_size=2), roots=M, continuations=N)


@pytest.fixture(scope="module")
def env():
    return tiny_env()


@pytest.fixture(scope="module")
def model():
    return init_policy(TINY_POLICY, seed=0)


def _roots(model, env, pool, prompt_of_slot, key, sampling=SAMPLING):
    ro = ex.start_roots(model, env, pool, ex.prefill_pool(model, pool), prompt_of_slot,
                        jax.random.split(key, prompt_of_slot.shape[0]), pad_id=protocol.PAD)
    return run_turns(model, env, ro, sampling=sampling)


def _forks(model, env, roots, parent, branch_turn, keys, sampling=SAMPLING):
    cont = ex.fork(model, env, roots, parent, branch_turn, keys, pad_id=protocol.PAD)
    return run_turns(model, env, cont, sampling=sampling)


def _fresh(model, env, roots, parent, turn, keys):
    ro = ex.restart(model, env, roots, parent, turn, keys, width=roots.tree.max_len, pad_id=protocol.PAD)
    return run_turns(model, env, ro, sampling=SAMPLING).tree


roots_phase = jit_with_model(_roots, static_argnames=("sampling",))
fork_phase = jit_with_model(_forks, static_argnames=("sampling",))
fresh_phase = jit_with_model(_fresh)


def anchors_of(tree, num_slots: int) -> list[tuple[int, int]]:
    """Every (root slot, non-final turn) of the finished roots, prompts interleaved."""
    per_root = [[(s, t) for t in range(int(tree.num_turns[s]) - 1)] for s in range(num_slots)]
    return [a for group in zip(*[g + [None] * (5 - len(g)) for g in per_root]) for a in group if a is not None]


def test_forked_slots_match_a_full_forward_of_their_sequences(env, temperature=0.7):
    """A trained (peaked) policy; anchors from every prompt. Each slot's sampled log-probs (at temperature
    0.7) and V~ readings equal an uncached full forward of its final sequence, read at `Tree.read_positions`
    as the loss does."""
    model, sampling = trained_policy(), SamplingConfig(temperature=temperature)
    pool = question_pool(env, np.arange(B))
    roots = roots_phase(model, env, pool, jnp.repeat(jnp.arange(B, dtype=jnp.int32), M // B), jax.random.key(1),
                        sampling=sampling)
    rt = jax.device_get(roots.tree)
    anchors = anchors_of(rt, M)[:M]
    assert len({int(rt.prompt[s]) for s, _ in anchors}) >= 3  # anchors from several prompts
    parent, turn = (jnp.asarray(x, jnp.int32) for x in zip(*anchors))
    cont = fork_phase(model, env, roots, parent, turn, jax.random.split(jax.random.key(7), len(anchors)),
                      sampling=sampling)
    tree = jax.device_get(ex.concat(roots.tree, cont.tree))
    out = model(jnp.asarray(tree.tokens))
    logp = np.asarray(token_logprobs(out.logits[:, :-1], jnp.asarray(tree.tokens[:, 1:]), temperature))
    mask = tree.policy_mask[:, 1:]
    assert mask[M:].sum() > 20 and np.exp(logp[mask]).mean() > 0.25  # far from uniform (1 / V < 0.01)
    np.testing.assert_allclose(tree.logprobs[:, 1:][mask], logp[mask], atol=1e-4)
    untempered = np.asarray(token_logprobs(out.logits[:, :-1], jnp.asarray(tree.tokens[:, 1:])))
    assert np.abs(untempered[mask] - logp[mask]).max() > 0.1  # scoring at temperature 1 would be caught
    reads = np.take_along_axis(np.asarray(out.success), np.asarray(tree.read_positions()), axis=1)
    assert tree.has_reading[M:].sum() > len(anchors)
    np.testing.assert_allclose(tree.success[tree.has_reading], reads[tree.has_reading], atol=1e-4)


class RecordingPolicy(Policy):
    """The policy, recording the shape of every forward's input as it runs (an independent count)."""

    calls: list = []

    def __call__(self, input_ids, **kwargs):
        shape = tuple(input_ids.shape)
        jax.debug.callback(lambda: RecordingPolicy.calls.append(shape), ordered=True)
        return super().__call__(input_ids, **kwargs)


def test_fed_positions_are_what_the_model_is_fed_and_forks_feed_no_prefix(env, model):
    recording = RecordingPolicy(TINY_POLICY, nnx.Rngs(0))
    nnx.update(recording, nnx.state(model))
    pool = question_pool(env, np.arange(B))
    RecordingPolicy.calls.clear()
    roots = roots_phase(recording, env, pool, jnp.repeat(jnp.arange(B, dtype=jnp.int32), M // B), jax.random.key(0))
    jax.effects_barrier()
    assert sum(r * w for r, w in RecordingPolicy.calls) == int(roots.fed_positions)  # pool prefill included
    rt = jax.device_get(roots.tree)
    parent, turn = (jnp.asarray(x, jnp.int32) for x in zip(*anchors_of(rt, M)[:M]))
    keys = jax.random.split(jax.random.key(3), M)
    RecordingPolicy.calls.clear()
    cont = fork_phase(recording, env, roots, parent, turn, keys)
    jax.effects_barrier()
    calls = list(RecordingPolicy.calls)
    assert sum(r * w for r, w in calls) == int(cont.fed_positions) > 0
    # forks feed one token per decode step and observation chunks (a turn's last token and its observation),
    # never a prefix
    assert {w for _, w in calls} <= {1, env.obs_len + 1} and all(r == M for r, _ in calls)
    RecordingPolicy.calls.clear()
    fresh_phase(recording, env, roots, parent, turn, keys)
    jax.effects_barrier()
    assert max(w for _, w in RecordingPolicy.calls) == rt.max_len  # re-prefill feeds each prefix again


def test_forked_continuation_equals_fresh_rollout_of_its_prefix(env, model):
    pool = question_pool(env, np.arange(B))
    roots = roots_phase(model, env, pool, jnp.repeat(jnp.arange(B, dtype=jnp.int32), M // B), jax.random.key(1))
    rt = jax.device_get(roots.tree)
    anchors = anchors_of(rt, M)[:M]
    assert len(anchors) >= 4
    parent = np.full(M, -1, np.int32)
    turn = np.full(M, -1, np.int32)
    parent[: len(anchors)], turn[: len(anchors)] = zip(*anchors)
    keys = jax.random.split(jax.random.key(7), M)
    forked = jax.device_get(fork_phase(model, env, roots, jnp.asarray(parent), jnp.asarray(turn), keys).tree)
    # Fresh: the prefix becomes a prompt that is prefilled from scratch; same per-slot keys.
    n = len(anchors)
    fresh = jax.device_get(fresh_phase(model, env, roots, jnp.asarray(parent[:n]), jnp.asarray(turn[:n]), keys[:n]))
    assert fresh.max_len == forked.max_len  # same slot length on both paths
    for i in range(n):
        length = int(forked.length[i])
        assert length == int(fresh.length[i])
        np.testing.assert_array_equal(forked.tokens[i, :length], fresh.tokens[i, :length])
        assert forked.reward[i] == fresh.reward[i]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_tree_invariants_under_random_allocations(env, model, data):
    counts = data.draw(st.lists(st.integers(0, M), min_size=B, max_size=B).filter(lambda c: sum(c) == M)
                       | st.just([M, 0, 0, 0]))
    prompt_of_slot = np.repeat(np.arange(B), counts).astype(np.int32)
    pool = question_pool(env, np.array(data.draw(st.lists(st.integers(0, 39), min_size=B, max_size=B))))
    roots = roots_phase(model, env, pool, jnp.asarray(prompt_of_slot), jax.random.key(data.draw(st.integers(0, 99))))
    rt = jax.device_get(roots.tree)
    anchors = [(s, t) for s in range(M) for t in range(int(rt.num_turns[s]) - 1)]
    picks = data.draw(st.lists(st.sampled_from(anchors) if anchors else st.nothing(), max_size=M * N))
    parent = np.full(M * N, -1, np.int32)
    turn = np.full(M * N, -1, np.int32)
    if picks:
        parent[: len(picks)], turn[: len(picks)] = zip(*picks)
    cont = jax.device_get(fork_phase(model, env, roots, jnp.asarray(parent), jnp.asarray(turn),
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
    before = ex.expand_tree.cache_size()
    for step in range(10):
        pool = question_pool(env, np.arange(step, step + B))
        tree, _, _ = ex.expand_tree(model, env, pool, jax.random.key(step), plan=PLAN, sampling=SAMPLING,
                                    pad_id=protocol.PAD)
    jax.block_until_ready(tree)
    assert ex.expand_tree.cache_size() - before <= 1


def test_sharded_slots_give_the_same_tree(env, model):
    pool = question_pool(env, np.arange(B))
    kwargs = dict(plan=PLAN, sampling=SAMPLING, pad_id=protocol.PAD)
    single, _, _ = ex.expand_tree(model, env, pool, jax.random.key(5), **kwargs)
    mesh = shd.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:4])
    sharded_model = init_policy(TINY_POLICY, seed=0, mesh=mesh)
    rows = functools.partial(shd.batch_sharding, mesh=mesh)
    sharded_pool = ex.Pool(*(jax.device_put(a, rows(a.shape)) for a in (pool.tokens, pool.lengths, pool.question)))
    assert len(sharded_pool.tokens.sharding.device_set) == 4
    sharded, _, _ = ex.expand_tree(sharded_model, env, sharded_pool, jax.random.key(5), mesh=mesh, **kwargs)
    for a, b in zip(jax.tree.leaves(jax.device_get(single)), jax.tree.leaves(jax.device_get(sharded))):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for leaf in jax.tree.leaves(sharded):  # every slot row lives on one device: each holds a quarter of them
        assert leaf.sharding.shard_shape(leaf.shape)[0] == M * (1 + N) // 4, leaf.sharding
    # and each device rolls out only its slots: in the partitioned program, the KV cache of stage 2's M*N slots
    # ([slots, kv heads, L, head dim]) is held a quarter per device (forks gather from all M roots' cache)
    hlo = ex.expand_tree.lower(sharded_model, env, sharded_pool, jax.random.key(5), mesh=mesh, **kwargs)
    kv = f"f32\\[(\\d+),{TINY_POLICY.num_kv_heads},{single.max_len},{TINY_POLICY.head_dim}\\]"
    rows = {int(r) for r in re.findall(kv, hlo.compile().as_text())}
    assert M * N // 4 in rows and M * N not in rows, rows


def _collectives(hlo: str) -> list[tuple[str, str, str]]:
    """(collective, shape, op_name) of each cross-device op in a compiled program's text."""
    found = re.findall(r"= (\S+) (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\("
                       r".*?op_name=\"([^\"]*)\"", hlo)
    return [(op, shape, name) for shape, op, name in found]


@pytest.mark.parametrize("sampling", [SAMPLING, SamplingConfig(temperature=0.7, top_p=0.9)], ids=["t1", "top_p"])
def test_a_sharded_episode_exchanges_only_scalars(env, sampling):
    """On a mesh splitting the slots each device plays its own rows: an episode's turns (the decode loops, the
    environment's steps, the observations) exchange only scalars, whether any slot is still active and the tokens
    counted, never rows. A write at each row's own position indexed by an iota of rows was partitioned as a gather
    of every row onto every device: each step's new keys and values on every layer, the tree's tokens, top-p's mask.
    """
    mesh = shd.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:4])
    model = init_policy(TINY_POLICY, seed=0, mesh=mesh)
    pool = shd.rows_on(question_pool(env, np.arange(B)), mesh)

    def episode(m, pool, key):
        ro = ex.start_roots(m, env, pool, ex.prefill_pool(m, pool), jnp.arange(M, dtype=jnp.int32) % B,
                            jax.random.split(key, M), pad_id=protocol.PAD)
        return shd.constrain_rows(run_turns(m, env, shd.constrain_rows(ro, mesh), sampling=sampling).tree, mesh)

    hlo = jit_with_model(episode).lower(model, pool, jax.random.key(0)).compile().as_text()
    exchanged = [c for c in _collectives(hlo) if "while/" in c[2]]  # inside the turns' loops
    assert exchanged, "the decode loop's stop test is an all-reduce: the pattern above no longer reads this HLO"
    assert all(op == "all-reduce" and shape.endswith("[]") for op, shape, _ in exchanged), exchanged
    per_token = [c for c in exchanged if c[2].count("while/") > 1]  # in a decode loop, inside the turns' loop
    assert [shape for _, shape, _ in per_token] == ["pred[]"], exchanged  # a decode step's one exchange


def test_degenerate_budgets(env, model):
    pool = question_pool(env, np.arange(B))
    one_prompt = Plan(Allocator("grpo", group_size=M), roots=M, continuations=0)  # one prompt gets every slot
    tree, _, stats = ex.expand_tree(model, env, pool, jax.random.key(2), plan=one_prompt, sampling=SAMPLING,
                                    pad_id=protocol.PAD)
    tree = jax.device_get(tree)
    assert tree.num_slots == M and (tree.prompt == tree.prompt[0]).all() and tree.done.all()
    # max turns reached without an answer: the untrained policy rarely answers
    cut_off = tree.num_turns == TINY_WORLD.max_turns
    assert cut_off.any() and (tree.reward[cut_off] == 0).all()
    assert int(stats["stage2_unplaced"]) == 0

    # one continuation per anchor at most and N = 6: budget the anchors cannot take is reported, not lost
    capped = Plan(Allocator("trace", max_per_anchor=1), roots=M, continuations=6)
    tree, _, stats = ex.expand_tree(model, env, pool, jax.random.key(2), plan=capped, sampling=SAMPLING,
                                    pad_id=protocol.PAD)
    tree = jax.device_get(tree)
    placed = int((tree.prompt[M:] >= 0).sum())
    assert 0 < int(stats["stage2_unplaced"]) == M * 6 - placed
    assert (tree.model_tokens[M + placed:] == 0).all() and tree.done.all()


def test_impossible_allocations_fail_clearly(env, model):
    pool = question_pool(env, np.arange(B))
    pre = ex.prefill_pool(model, pool)
    with pytest.raises(ValueError, match="prompt_of_slot has entries outside"):
        ex.start_roots(model, env, pool, pre, jnp.array([0, 1, 9, 2]), jax.random.split(jax.random.key(0), 4),
                       pad_id=protocol.PAD)
    roots = roots_phase(model, env, pool, jnp.repeat(jnp.arange(B, dtype=jnp.int32), M // B), jax.random.key(1))
    with pytest.raises(ValueError, match="non-final turn"):
        ex.fork(model, env, roots, jnp.array([0]), jnp.array([TINY_WORLD.max_turns]),
                jax.random.split(jax.random.key(0), 1), pad_id=protocol.PAD)
