"""The tree-packed update feeds each distinct token once and gives the unpacked loss, metrics and gradients.

Tolerances: packed and unpacked sum the same terms in other orders (softmax over keys laid out differently, a
shared token's gradient summed before its copies' would be, token means over fewer, weighted entries), so their
float32 roundings differ (in float64 they agree to ~1e-14). Loss and metrics: within 1e-5 absolute plus 1e-5
relative (ratio_max_dev and the entropy are O(1)). Gradients, every leaf: within 1e-5 times the leaf's largest
entry where that exceeds 1, else absolute (a gradient entry summing many cancelling terms carries their
rounding, not its own size's). The overflow fallback runs the unpacked computation itself, inside a `lax.cond`
that XLA may fuse differently: within 1e-6.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import example, given, settings
from hypothesis import strategies as st

from toy import TINY_POLICY, TINY_WORLD, tiny_env
from trace_jax.allocation import Allocator, Plan
from trace_jax.config import TrainConfig, load_config
from trace_jax.envs.hopworld import protocol
from trace_jax.evaluate import question_pool
from trace_jax.metrics import MetricsLogger
from trace_jax.models import Paged, with_predictor_layers
from trace_jax.models.cache import KVCache
from trace_jax.objectives import advantages
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import expand_tree
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import init_policy
from trace_jax.train.loop import Budget, record_step, step_spec
from trace_jax.train.packing import auto_row_len, canonical_sources, pack, prompt_sizes
from trace_jax.train.step import StepSpec, tree_grads
from float32 import assert_float32_close, tree_scale

POLICY = dataclasses.replace(TINY_POLICY, num_layers=2)
M, N, TURNS, WIDTH = 4, 2, 3, 24  # random trees: S = 12 slots of L = 24
ROWS, ROW_LEN, BLOCK = 3, 64, 4  # their packing: 192 < S * L = 288 positions, each slot's tokens from a block
SPEC = StepSpec(plan=Plan(Allocator("uniform_tree", group_size=2), roots=M, continuations=N),
                sampling=SamplingConfig(temperature=0.7), clip_eps=0.2, kl_coef=0.1, predictor_coef=1.0,
                pad_id=protocol.PAD, predictor_backbone_grad=True)
PACKED = dataclasses.replace(SPEC, pack_rows=ROWS, pack_len=ROW_LEN, pack_block=BLOCK)


@pytest.fixture(scope="module")
def state():
    """(graphdef, params, ref_params): a random 2-layer policy with peaked next-token distributions (matrices at
    10x the init scale: ~3.8 nats at temperature 0.7, of 5.1 uniform; larger scales make the model so
    ill-conditioned that float32 rounding alone reaches 1e-5), a nonzero success head (so the reads
    matter), and a perturbed reference for the KL term."""
    graphdef, params = nnx.split(init_policy(POLICY, seed=0))

    @jax.jit
    def perturbed(params):
        keys = iter(jax.random.split(jax.random.key(1), 64))
        noise = lambda x, std: x + std * jax.random.normal(next(keys), x.shape)
        params = jax.tree.map(lambda x: 10 * x if x.ndim >= 2 else noise(x, 0.3), params)
        return params, jax.tree.map(lambda x: noise(x, 0.05), params)

    return graphdef, *perturbed(params)


def grads_fn(graphdef, spec):
    return jax.jit(lambda params, ref, tree: tree_grads(graphdef, spec, params, ref, tree))


@pytest.fixture(scope="module")
def compiled(state):
    """tree_grads jitted per spec, once per module (every random tree has the same shapes)."""
    return functools.cache(lambda spec: grads_fn(state[0], spec))


def random_tree(seed: int, roots: int, prompts: int, forks: float) -> Tree:
    """A tree as the rollout builds one: `roots` used root slots (at random slots of M) over `prompts` prompts
    (sharing their prompt tokens), turns of policy tokens then an observation, each continuation slot used with
    probability `forks` (restarting after a random non-final turn of its parent, with a copy of its prefix).
    Sampling log-probabilities are random, so ratios are far from 1 and both clip sides are active."""
    rng = np.random.default_rng(seed)
    s = M + M * N
    tree = {k: np.asarray(v).copy() for k, v in dataclasses.asdict(Tree.empty(s, WIDTH, TURNS, 0)).items()}
    prompt_ids = rng.choice(5, prompts, replace=False)
    prompt_len = {p: int(rng.integers(1, 5)) for p in prompt_ids}
    prompt_tokens = {p: rng.integers(0, POLICY.vocab_size, prompt_len[p]) for p in prompt_ids}

    def play(slot: int, first_turn: int) -> None:  # turns first_turn.. of a slot holding its prefix
        length = tree["length"][slot]
        for t in range(first_turn, int(rng.integers(first_turn + 1, TURNS + 1))):
            act, obs = int(rng.integers(1, 4)), int(rng.integers(1, 3))
            span = slice(length, length + act + obs)
            tree["tokens"][slot, span] = rng.integers(0, POLICY.vocab_size, act + obs)
            tree["policy_mask"][slot, length:length + act] = True
            tree["logprobs"][slot, length:length + act] = -rng.uniform(0.0, 4.0, act)
            length += act + obs
            tree["boundaries"][slot, t] = length
            tree["success"][slot, t + 1] = rng.uniform()
            tree["num_turns"][slot] = t + 1
        tree["length"][slot] = length

    used_roots = rng.choice(M, roots, replace=False)
    for i, r in enumerate(used_roots):
        p = prompt_ids[i % prompts] if i < prompts else rng.choice(prompt_ids)
        n = prompt_len[p]
        tree["tokens"][r, :n] = prompt_tokens[p]
        tree["length"][r], tree["prompt_len"][r], tree["prompt"][r], tree["question"][r] = n, n, p, p
        tree["success"][r, 0] = rng.uniform()
        play(r, 0)
    for c in range(M, s):
        parent = (c - M) // N
        turns = tree["num_turns"][parent]
        if tree["prompt"][parent] == Tree.NO_PROMPT or turns < 2 or rng.uniform() >= forks:
            continue
        b = int(rng.integers(0, turns - 1))
        cut = tree["boundaries"][parent, b]
        for k in ("tokens", "policy_mask", "logprobs"):
            tree[k][c, :cut] = tree[k][parent, :cut]
        tree["boundaries"][c, :b + 1] = tree["boundaries"][parent, :b + 1]
        tree["success"][c, :b + 2] = tree["success"][parent, :b + 2]
        for k in ("prompt_len", "prompt", "question"):
            tree[k][c] = tree[k][parent]
        tree["parent"][c], tree["branch_turn"][c], tree["length"][c], tree["num_turns"][c] = parent, b, cut, b + 1
        play(c, b + 1)
    used = tree["prompt"] != Tree.NO_PROMPT
    tree["reward"] = np.where(used, rng.uniform(size=s), 0.0).astype(np.float32)
    tree["done"] = np.ones(s, bool)
    return Tree(**{k: jnp.asarray(v) for k, v in tree.items()})


TREES = dict(seed=st.integers(0, 2**31 - 1), roots=st.integers(1, M), prompts=st.integers(1, 3),
             forks=st.sampled_from([0.0, 0.6, 1.0]))


def assert_close(got, want, atol: float, err_msg: str = "") -> None:
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol, rtol=atol, err_msg=err_msg)


def assert_same_update(packed, unpacked, tol: float = 1e-5) -> None:
    """(loss, aux, grads) of the packed update equal the unpacked ones, within tol as the module says."""
    assert_close(packed[0], unpacked[0], tol, "loss")
    for k, v in unpacked[1].items():
        assert_close(packed[1][k], v, tol, k)
    scale = max(tree_scale(unpacked[2]), 1.0)  # the gradient of an O(1) loss: its terms' size, not each tensor's
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(packed[2]), jax.tree.leaves(unpacked[2])):
        assert_float32_close(a, b, scale_tol=tol, scale=scale, err_msg=jax.tree_util.keystr(path))


def brute_force_sources(tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """(src [S, L], fork [S]) by walking owners one position at a time: the canonical copy of (s, p) is s from its
    fork on, else its owner's (a continuation's parent; a later root's the first root of its prompt)."""
    t = jax.tree.map(np.asarray, tree)
    s, width = t.tokens.shape
    owner, fork = np.arange(s), np.zeros(s, int)
    for i in range(s):
        if t.prompt[i] == Tree.NO_PROMPT:
            continue
        if t.parent[i] != Tree.NO_PARENT:
            owner[i], fork[i] = t.parent[i], t.boundaries[t.parent[i], t.branch_turn[i]]
            continue
        first = min(j for j in range(s) if t.prompt[j] == t.prompt[i] and t.parent[j] == Tree.NO_PARENT)
        owner[i], fork[i] = first, (t.prompt_len[i] if first != i else 0)
    src = np.zeros((s, width), int)
    for i in range(s):
        for p in range(width):
            c = i
            while p < fork[c]:
                c = owner[c]
            src[i, p] = c
    return src, fork


def tree_sizes(tree: Tree, block: int) -> np.ndarray:
    """Positions each prompt's canonical tokens take, each slot's in whole blocks, by prompt index (used ones)."""
    t = jax.tree.map(np.asarray, tree)
    used = t.prompt != Tree.NO_PROMPT
    span = -(-(t.length - brute_force_sources(tree)[1]) // block) * block
    sizes = np.bincount(t.prompt[used], weights=span[used]).astype(int)
    return sizes[sizes > 0]


def next_fit(tree: Tree, block: int = BLOCK) -> tuple[int, int]:
    """(rows, largest prompt): next-fit of every prompt's canonical tokens (by prompt index), each whole and each
    slot's in whole blocks, into rows of ROW_LEN, however many it takes."""
    sizes = tree_sizes(tree, block)
    rows, fill = 1, 0
    for n in sizes:
        if fill + n > ROW_LEN:
            rows, fill = rows + 1, 0
        fill += n
    return rows, int(sizes.max())


def fits(tree: Tree, block: int = BLOCK) -> bool:
    """Whether next-fit lays every prompt's canonical tokens, each whole, into ROWS x ROW_LEN."""
    rows, largest = next_fit(tree, block)
    return largest <= ROW_LEN and rows <= ROWS


@settings(max_examples=12, deadline=None)
@given(**TREES)
@example(seed=0, roots=1, prompts=1, forks=0.0)  # one episode
@example(seed=1, roots=M, prompts=1, forks=0.0)  # plain GRPO: one prompt's group, no continuations
@example(seed=2, roots=M, prompts=2, forks=1.0)  # every continuation slot used
def test_packed_update_equals_unpacked(state, compiled, seed, roots, prompts, forks):
    """Random trees (unused slots, several prompts, forks after random turns): the loss, every metric and every
    gradient of the packed update are the unpacked ones; a tree the rows cannot hold is flagged and runs unpacked."""
    _, params, ref = state
    tree = random_tree(seed, roots, prompts, forks)
    unpacked = compiled(SPEC)(params, ref, tree)
    packed = compiled(PACKED)(params, ref, tree)
    overflow = not fits(tree)
    assert bool(packed[1]["pack_overflow"]) == overflow  # then the unpacked computation ran: the same values
    assert int(packed[1]["update_positions"]) == (tree.tokens.size if overflow else ROWS * ROW_LEN)
    assert int(packed[1]["pack_needed"]) == tree_sizes(tree, BLOCK).sum()
    assert_same_update(packed, unpacked)


@settings(max_examples=15, deadline=None)
@given(**TREES, block=st.sampled_from([1, BLOCK, 16]))
def test_packing_against_brute_force(seed, roots, prompts, forks, block):
    """Copies hold their canonical copy's token, mask and log-prob; every canonical token sits once in the rows,
    each slot's from a block's start; each query sees exactly its slot's causal prefix (keys at their canonical
    copies, in position order); each token is scored from its slot's previous position, read where its slot
    reads, and carries the loss terms of the slots holding it."""
    tree = random_tree(seed, roots, prompts, forks)
    t = jax.tree.map(np.asarray, tree)
    s, adv = t.num_slots, np.asarray(advantages(tree))
    src, fork = map(np.asarray, jax.jit(canonical_sources)(tree))
    want_src, want_fork = brute_force_sources(tree)
    used = t.prompt != Tree.NO_PROMPT
    real = used[:, None] & (np.arange(WIDTH) < t.length[:, None])
    np.testing.assert_array_equal(np.where(real, src, -1), np.where(real, want_src, -1))
    np.testing.assert_array_equal(fork[used], want_fork[used])
    for name in ("tokens", "policy_mask", "logprobs"):
        x = getattr(t, name)
        np.testing.assert_array_equal(np.where(real, x[src, np.arange(WIDTH)], 0), np.where(real, x, 0))

    sizes = np.asarray(prompt_sizes(tree, block))
    np.testing.assert_array_equal(sizes[sizes > 0], tree_sizes(tree, block))  # what the bench sizes its row by
    packed = jax.tree.map(np.asarray, jax.jit(pack, static_argnums=(2, 3, 4))(tree, jnp.asarray(adv), ROWS, ROW_LEN,
                                                                               block))
    assert bool(packed.overflow) == (not fits(tree, block)) and int(packed.needed) == tree_sizes(tree, block).sum()
    if packed.overflow:
        return
    token = packed.slot < s  # [R, Lp]
    where = {(int(packed.slot[r, c]), int(packed.positions[r, c])): (r, c) for r, c in zip(*np.nonzero(token))}
    canonical = real & (np.arange(WIDTH) >= fork[:, None])
    assert sorted(where) == sorted(zip(*map(np.ndarray.tolist, np.nonzero(canonical)))) and len(where) == token.sum()
    for i in np.nonzero(used)[0]:
        if want_fork[i] < t.length[i]:
            assert where[i, want_fork[i]][1] % block == 0  # a slot's first token starts a block
    flat = lambda i, p: where[want_src[i, p], p][0] * ROW_LEN + where[want_src[i, p], p][1]  # (s, p)'s copy
    terms = {k: np.zeros((ROWS, ROW_LEN)) for k in ("paths", "pos_adv", "neg_adv", "num_pos", "num_neg")}
    for i, p in zip(*np.nonzero(real & t.policy_mask & (np.arange(WIDTH) >= 1))):
        r, c = divmod(flat(i, p), ROW_LEN)
        a = adv[i]
        for k, v in dict(paths=1, pos_adv=max(a, 0), neg_adv=max(-a, 0), num_pos=a > 0, num_neg=a < 0).items():
            terms[k][r, c] += v
    for k, v in terms.items():
        np.testing.assert_allclose(getattr(packed.weights, k), v, atol=1e-6, err_msg=k)
    nodes = np.asarray(t.read_positions())
    for i, k in zip(*np.nonzero(used[:, None] & (nodes < t.length[:, None]))):
        assert packed.reads[i, k] == flat(i, nodes[i, k])
    for r in range(ROWS):
        for q in range(ROW_LEN):
            keys = packed.paged.keys[r, q // block]
            seen = keys[packed.paged.attend[r, q // block, q % block]]  # the row's columns the query sees
            if not token[r, q]:
                assert len(seen) == 1  # padding sees one key: a finite softmax
                continue
            i, p = int(packed.slot[r, q]), int(packed.positions[r, q])
            assert packed.tokens[r, q] == t.tokens[i, p] and packed.logp_old[r, q] == t.logprobs[i, p]
            if p >= 1:
                assert packed.prev[r, q] == flat(i, p - 1)
            np.testing.assert_array_equal(r * ROW_LEN + seen, [flat(i, k) for k in range(p + 1)])
            np.testing.assert_array_equal(packed.positions[r, seen], np.arange(p + 1))
            np.testing.assert_array_equal(packed.tokens[r, seen], t.tokens[i, :p + 1])


def test_a_real_rollout_packs_to_the_same_update(state, compiled):
    """A uniform tree rolled out on a 3-turn HopWorld (2 prompts x 2 roots x 2 continuations): copies are exact
    (tokens, masks and sampling log-probs), and the packed update is the unpacked one on fewer positions: rows
    sized by `pack_len: 0` (the default), half the unpacked positions."""
    graphdef, params, ref = state
    world = dataclasses.replace(TINY_WORLD, max_hops=2, max_turns=3, action_len=8)
    env = tiny_env(world)
    tree, _, _ = expand_tree(nnx.merge(graphdef, params), env, question_pool(env, np.arange(4)), jax.random.key(0),
                             plan=SPEC.plan, sampling=SPEC.sampling, pad_id=protocol.PAD)
    assert int(tree.is_continuation.sum()) == M * N
    tree = dataclasses.replace(tree, reward=jnp.asarray(np.random.default_rng(0).uniform(size=tree.num_slots),
                                                        jnp.float32))  # a random policy rarely succeeds
    t = jax.tree.map(np.asarray, tree)
    src = np.asarray(canonical_sources(tree)[0])
    real = np.arange(t.max_len) < t.length[:, None]
    for name in ("tokens", "policy_mask", "logprobs"):
        x = getattr(t, name)
        np.testing.assert_array_equal(np.where(real, x[src, np.arange(t.max_len)], 0), np.where(real, x, 0), name)

    update = lambda spec: compiled(spec)(ref, params, tree)  # the loss at moved parameters: ratios away from 1
    unpacked = update(SPEC)
    assert float(unpacked[1]["clip_frac"]) > 0 and float(unpacked[1]["kl_ref"]) > 0
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(unpacked[2])) > 1e-3  # not a vanishing gradient
    packed = update(dataclasses.replace(SPEC, pack_rows=2, pack_len=0, pack_block=8))
    assert not bool(packed[1]["pack_overflow"])
    assert tree.tokens.shape == (12, 155)  # half of S x L = 930 positions: 465 a row, 59 whole blocks of 8
    assert int(packed[1]["update_positions"]) == 2 * auto_row_len(12, 155, 2, 8) == 2 * 59 * 8
    assert_same_update(packed, unpacked)


def test_a_predictor_with_its_own_layer_packs_to_the_same_update(state):
    """The predictor's own layer reads the packed rows too (its keys paged like the policy's): loss, metrics and
    gradients (its layer's, and the backbone's through it) are the unpacked ones. (Where its gradient goes with
    and without predictor_backbone_grad: tests/models/test_predictor_layers.py.)"""
    graphdef, params, ref = state
    model = with_predictor_layers(nnx.merge(graphdef, params), 1)
    model.predictor[0].mlp.up_proj[...] = 1.3 * model.predictor[0].mlp.up_proj[...]  # not the top layer's copy
    model.success_kernel[...] = jax.random.normal(jax.random.key(3), model.success_kernel.shape)
    grown, grown_params = nnx.split(model)
    grown_ref = nnx.state(with_predictor_layers(nnx.merge(graphdef, ref), 1))
    spec = SPEC  # predictor_backbone_grad: the predictor's gradient reaches the layer below through the rows too
    tree = random_tree(2, roots=M, prompts=2, forks=1.0)
    assert fits(tree)
    unpacked = grads_fn(grown, spec)(grown_params, grown_ref, tree)
    packed = grads_fn(grown, dataclasses.replace(spec, pack_rows=ROWS, pack_len=ROW_LEN, pack_block=BLOCK))(
        grown_params, grown_ref, tree)
    assert not bool(packed[1]["pack_overflow"])
    assert_same_update(packed, unpacked)
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(unpacked[2]["predictor"]))


def test_a_tree_the_rows_cannot_hold_falls_back(state, compiled):
    """A prompt with 4 roots and 8 continuations holds more canonical tokens than a row: flagged, and the update is
    the unpacked one, from the same program."""
    _, params, ref = state
    tree = random_tree(0, roots=M, prompts=1, forks=1.0)
    src, fork = jax.jit(canonical_sources)(tree)
    assert int(jnp.sum(jnp.where(tree.used, tree.length - fork, 0))) > ROW_LEN and not fits(tree)
    unpacked = compiled(SPEC)(params, ref, tree)
    fallback = compiled(PACKED)(params, ref, tree)
    assert bool(fallback[1]["pack_overflow"]) and int(fallback[1]["update_positions"]) == tree.tokens.size
    assert_same_update(fallback, unpacked, tol=1e-6)


def test_prompts_that_each_fit_a_row_but_need_more_rows_than_exist_void_the_packing():
    """Two prompts of 44 positions each fit a row of 64, not one row together: packed into a single row, the second
    prompt's tokens have nowhere to go, and the packing is flagged void (the update then runs unpacked) rather than
    dropping them."""
    tree = random_tree(0, roots=M, prompts=2, forks=1.0)
    assert tree_sizes(tree, BLOCK).tolist() == [44, 44]
    adv = advantages(tree)
    one_row = jax.jit(pack, static_argnums=(2, 3, 4))(tree, adv, 1, ROW_LEN, BLOCK)
    assert bool(one_row.overflow) and int(one_row.needed) == 88
    two_rows = jax.jit(pack, static_argnums=(2, 3, 4))(tree, adv, 2, ROW_LEN, BLOCK)
    assert not bool(two_rows.overflow) and int((two_rows.slot < tree.num_slots).sum()) == int(
        jnp.sum(jnp.where(tree.used, tree.length - canonical_sources(tree)[1], 0)))  # every canonical token placed


def test_packing_options(state):
    """Rows, then their length, rows of whole blocks, in the step and in the train config (which passes them on;
    its default, pack_rows -1, packs in one row per data-parallel device on a CPU, in rows of half the unpacked
    positions). The policy refuses positions and paged keys with a cache (decoding). Given every position as keys
    with the causal mask, one block of the row or blocks of 2, its forward is the default one; a branching mask
    changes it, and through `remat_layers` it sees the same keys."""
    with pytest.raises(ValueError, match="pack_rows=0 and pack_len=32"):
        dataclasses.replace(SPEC, pack_len=32)
    with pytest.raises(ValueError, match="pack_len=60 must be a multiple of pack_block=16"):
        dataclasses.replace(SPEC, pack_rows=2, pack_len=60)
    for bad in (["pack_rows=0", "pack_len=512"], ["pack_rows=-2"]):
        with pytest.raises(ValueError, match=f"train.pack_rows={bad[0][10:]} and train.pack_len="):
            load_config(TrainConfig, None, bad)
    with pytest.raises(ValueError, match="train.pack_len=500 must be a multiple of train.pack_block=16"):
        load_config(TrainConfig, None, ["pack_rows=6", "pack_len=500"])
    cfg = load_config(TrainConfig, None, ["pack_rows=6", "pack_len=512", "pack_block=32"])
    spec = step_spec(cfg, Budget(cfg.roots, cfg.continuations, cfg.group_size), protocol.PAD)
    assert (spec.pack_rows, spec.pack_len, spec.pack_block) == (6, 512, 32)  # what `trace-jax train` runs
    default = TrainConfig()
    spec = step_spec(default, Budget(8, 2, 4), protocol.PAD)
    assert (spec.pack_rows, default.pack_len) == (1, 0)  # this CPU, no mesh
    assert step_spec(dataclasses.replace(default, pack_rows=0), Budget(8, 2, 4), protocol.PAD).pack_rows == 0
    graphdef, params, _ = state
    tokens = jnp.arange(6, dtype=jnp.int32)[None] + 3
    every = jnp.arange(6)[None, None]  # [rows, blocks, seen]: one block seeing the whole row
    causal = jnp.tril(jnp.ones((6, 6), bool))[None, None]  # [rows, blocks, block, seen]
    with pytest.raises(ValueError, match="positions and paged apply to a forward without a cache"):
        nnx.merge(graphdef, params)(tokens, cache=KVCache.init(POLICY, 1, 8), paged=Paged(every, causal))
    two_paths = Paged(every, causal.at[..., 3:, 1:3].set(False))  # positions 3.. branch after 0
    pairs = Paged(jnp.broadcast_to(every, (1, 3, 6)), causal.reshape(1, 3, 2, 6))  # blocks of 2, causal

    @jax.jit
    def forwards(params):
        policy = nnx.merge(graphdef, params)
        positions = jnp.array([[0, 1, 2, 1, 2, 3]])
        causal_forward = lambda paged: policy(tokens, positions=jnp.arange(6)[None], paged=paged).logits
        return (policy(tokens).logits, causal_forward(Paged(every, causal)), causal_forward(pairs),
                policy(tokens, positions=positions, paged=two_paths).logits,
                policy(tokens, positions=positions, paged=two_paths, remat=True).logits)

    default, causal, blocks, packed, remat = forwards(params)
    np.testing.assert_allclose(causal, default, atol=1e-5)
    np.testing.assert_allclose(blocks, default, atol=1e-5)
    np.testing.assert_allclose(remat, packed, atol=1e-5)
    assert float(jnp.abs(packed - default).max()) > 1e-2  # the mask and positions do change the forward


def test_a_step_that_ran_unpacked_is_reported(tmp_path, capsys):
    """The run says when a step's tree overflowed the packing (and how to size it), and only then."""
    row = {"pool_v_values": np.full(4, 0.5), "roots_per_prompt": np.zeros(3), "continuations_per_anchor": np.zeros(3),
           "loss": np.float32(0.1), "skipped": np.bool_(False), "update_positions": np.int32(288),
           "pack_needed": np.int32(300)}
    with MetricsLogger(tmp_path) as log:
        record_step(log, 1, dict(row, pack_overflow=np.bool_(False)))
        assert "did not fit the packing" not in capsys.readouterr().out
        last = record_step(log, 2, dict(row, pack_overflow=np.bool_(True)))
    assert last["pack_overflow"] == 1.0
    out = capsys.readouterr().out  # tqdm.write: stdout
    assert "step 2: a prompt's tree did not fit the packing" in out and "its trees take 300 positions" in out
    said: set[str] = set()  # a run's: said once, however many of its steps overflow
    with MetricsLogger(tmp_path / "run") as log:
        for step in (1, 2, 3):
            assert record_step(log, step, dict(row, pack_overflow=np.bool_(True)), said)["pack_overflow"] == 1.0
    assert capsys.readouterr().out.count("did not fit the packing") == 1
