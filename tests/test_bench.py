"""Smoke test of the sampler benchmark's measurements on a tiny model (speed is not asserted)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toy import TINY_POLICY, tiny_env
from trace_jax.bench.sampler import (
    DRAW_SIDES,
    alternate,
    decode_flops_per_token,
    dot_run,
    draws_alone,
    hopworld_policy,
    host_mesh,
    in_dtype,
    sampler_vs_transformers,
    tree_fork_vs_reprefill,
)
from trace_jax.config import MeshConfig
from trace_jax.envs.hopworld import HopWorldConfig
from trace_jax.models import ModelConfig
from trace_jax.sharding import init_policy, make_mesh


@pytest.mark.slow  # the counting contract is tested in tests/rollout/test_expand.py; this smoke-runs the bench
def test_fork_benchmark_counts_and_utilisation():
    wcfg = HopWorldConfig(seed=4, num_entities=64, num_questions=60, max_hops=2, max_turns=3)
    r = tree_fork_vs_reprefill(init_policy(TINY_POLICY, 0), tiny_env(wcfg), num_prompts=2, roots_per_prompt=2, n=2,
                               repeats=1)
    assert r["slot_len_fork"] == r["slot_len_reprefill"]
    assert 0 < r["useful_fork"] < r["useful_reprefill"] and r["useful_fork"] <= r["processed_fork"]
    assert 0 < r["processed_fork"] < r["processed_reprefill"]
    assert 0 < r["utilisation_roots"] <= 1 and 0 < r["utilisation_continuations"] <= 1
    mesh = make_mesh(MeshConfig(data=-1), jax.devices()[:2])
    r = sampler_vs_transformers(init_policy(TINY_POLICY, 0), batch=4, prompt_len=5, steps=6, repeats=2, mesh=mesh)
    sides = [("gumbel", 1), ("inverse_cdf", 1), ("gumbel", 2)]
    assert r["transformers"].shape == r["dot"].shape == (2,) and list(r["ours"]) == sides
    for side in sides:
        assert r["ours"][side].shape == r["decode"][side].shape == (2,)
        assert (r["ours"][side] > 0).all() and (r["decode"][side] > r["ours"][side]).all()
    assert (r["transformers"] > 0).all() and (r["dot"] > 0).all()


def test_the_split_row_needs_host_devices_that_divide_the_batch(capsys):
    """The bench's split side runs over every host device (8 in the tests) when they divide the batch, and otherwise
    is left out saying why."""
    assert host_mesh(16).shape == {"data": 8, "fsdp": 1, "tensor": 1}
    assert host_mesh(12) is None and "8 host devices do not divide it" in capsys.readouterr().out


def test_sides_take_turns_after_one_untimed_call_each():
    """A comparison's sides alternate, in reverse order every other round, after a first call of each that is not
    timed: timing one side's runs and then the other's would hand the machine's drift to the ratio."""
    calls = []
    sides = {name: (lambda name=name: calls.append(name) or len(calls)) for name in ("a", "b")}
    t = alternate(sides, repeats=4)
    assert calls == ["a", "b"] + ["a", "b", "b", "a"] * 2
    assert [t["a"].outputs, t["b"].outputs] == [[3, 6, 7, 10], [4, 5, 8, 9]]
    assert t["a"].times.shape == t["b"].times.shape == (4,) and (t["a"].times >= 0).all()


def test_the_draw_table_times_each_draw_over_the_same_chain_of_keys():
    """Each side chains its draws under keys folded from its last tokens: jax.random.categorical and our Gumbel-max,
    which draw the same tokens, end on the same tokens after every timed call (a side that timed another draw, or
    skipped draws, would not); the inverse-CDF side draws tokens of the vocabulary."""
    t, calls = draws_alone(rows=4, vocab=300, repeats=2)
    assert list(t) == list(DRAW_SIDES) and calls == 1000
    for ours, theirs in zip(t["gumbel"].outputs, t["jax.random"].outputs):
        np.testing.assert_array_equal(ours, theirs)
    inverse = np.asarray(t["inverse_cdf"].outputs)
    assert inverse.shape == (2, 4) and ((inverse >= 0) & (inverse < 300)).all()
    assert all(timed.times.shape == (2,) and (timed.times > 0).all() for timed in t.values())


def test_solver_benchmark_prints_rows(capsys):
    from trace_jax.bench.solver import run_solver_bench

    run_solver_bench(pool_sizes=(4,), roots=(6,), repeats=1)
    rows = capsys.readouterr().out.splitlines()
    assert any(r.split()[:3] == ["root_counts", "4", "6"] for r in rows)
    assert any(r.split()[:3] == ["prefix_counts", "4", "6"] for r in rows)


def test_contrast_figures_by_hand():
    from trace_jax.bench.contrast import contrast_figures

    # 4 questions x 4 episodes (the last one held out); groups of 2 = the first two episodes
    reward = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0, 0]], bool)
    hops = np.array([1, 1, 2, 2])
    r = contrast_figures(reward, hops, group=2)
    assert r["success_hop1"] == pytest.approx(5 / 6) and r["success_hop2"] == 0.0
    assert r["mixed_at_group"] == 0.25  # only question 1's first two episodes differ
    # held-out outcomes [1, 0, 1, 0]; own rates [1, 2/3, 0, 0]: positives score 1 and 0, negatives 2/3 and 0
    assert r["auc_question_mean"] == pytest.approx((1 + 1 + 0 + 0.5) / 4)
    assert r["auc_hop_rate"] == pytest.approx((1 + 0.5 + 0.5 + 0) / 4)


def test_true_rate_auc_against_the_auc_of_the_drawn_rates():
    """Questions with rates p ~ Beta(3, 2), 9 episodes each: the fitted ceiling matches the AUC of the drawn rates
    themselves for fresh outcomes (Monte Carlo, 200k draws), and the empirical rate over 8 episodes scores well
    below it. Without spread (p = 0.5 for all) the ceiling is near 0.5: the fit reads a little spread into the
    counts' noise."""
    from trace_jax.bench.contrast import contrast_figures, true_rate_auc
    from trace_jax.objectives import auc

    rng = np.random.default_rng(0)
    rate = rng.beta(3.0, 2.0, 4000)
    reward = rng.random((4000, 9)) < rate[:, None]
    got, a, b = true_rate_auc(reward)
    assert a == pytest.approx(3.0, rel=0.2) and b == pytest.approx(2.0, rel=0.2)
    p = rng.beta(3.0, 2.0, 200_000)
    won = rng.random(p.shape) < p
    want = float(auc(p, won, np.ones_like(won)))
    assert got == pytest.approx(want, abs=0.01)
    figures = contrast_figures(reward, np.ones(4000, int), group=2)
    assert figures["auc_question_mean"] < want - 0.03 and 0 < figures["auc_true_rate_se"] < 0.01
    flat, _, _ = true_rate_auc(rng.random((4000, 9)) < 0.5)
    assert 0.5 <= flat < 0.55


def test_decode_flops_count_every_projection_and_the_attention_by_hand():
    cfg = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=3)
    # per layer: q 4x6, k 4x3, v 4x3, o 6x4 -> 72; MLP 3 x 4x6 -> 72; scores and sum over 5 positions, 6 wide -> 60
    assert decode_flops_per_token(cfg, context=5) == 2 * (2 * (72 + 72 + 60) + 4 * 10)
    dot, flops = dot_run(8, cfg)
    assert flops == 2 * 8 * 4 * 6 * 50  # 50 chained dots [8, 4] x [4, 6]
    out = np.asarray(dot())
    assert out.shape == (8, 4) and np.isfinite(out).all()


def test_the_benchs_bfloat16_policy_holds_the_same_weights_rounded():
    model = init_policy(TINY_POLICY, 0)
    assert in_dtype(model, "float32") is model
    bf16 = in_dtype(model, "bfloat16")
    assert bf16.cfg.dtype == bf16.cfg.param_dtype == "bfloat16"
    for name in ("embed_tokens", "lm_head"):
        ours = np.asarray(getattr(bf16, name)[...])
        assert ours.dtype == jnp.bfloat16, name
        np.testing.assert_array_equal(ours, np.asarray(getattr(model, name)[...]).astype(jnp.bfloat16))
    np.testing.assert_array_equal(bf16.layers[0].mlp.up_proj[...],
                                  np.asarray(model.layers[0].mlp.up_proj[...]).astype(jnp.bfloat16))


def _slot(world, question, docs, invalid_at=()):
    """One root slot of `question` whose turn t retrieves entity docs[t] (an invalid turn at invalid_at), then answers:
    (tokens, boundaries) as the engine lays them out."""
    from trace_jax.envs.hopworld import protocol

    tokens = protocol.prompt_ids(world.question_ids(question))
    prompt_len, boundaries = len(tokens), []
    for t, e in enumerate(docs):
        action = [protocol.THINK, protocol.THINK_END, protocol.SEARCH, *world.name_ids(e), protocol.SEARCH_END]
        obs = list(protocol.INVALID_OBS) if t in invalid_at else [protocol.INFO, *world.doc_ids(e), protocol.INFO_END]
        tokens += action + obs
        boundaries.append(len(tokens))
    tokens += [protocol.THINK, protocol.THINK_END, protocol.ANSWER, protocol.ANSWER_END]
    boundaries.append(len(tokens))
    return tokens, prompt_len, boundaries


def test_chain_progress_counts_chain_documents_in_order():
    import dataclasses

    from trace_jax.bench.contrast import chain_progress, prefix_states
    from trace_jax.envs.hopworld import build_world, protocol
    from trace_jax.rollout.tree import Tree

    world = build_world(HopWorldConfig(seed=3, num_entities=64, num_questions=200))
    q = int(np.flatnonzero(world.hops == 3)[0])
    chain = world.chain(q)  # checked against the relations in tests/envs/test_hopworld_world.py
    other = next(e for e in range(world.num_entities) if e not in chain)
    slots = [_slot(world, q, chain[:3]),  # the expert's path: 1, 2, 3 entities reached
             _slot(world, q, [chain[1], other, chain[0], chain[2]]),  # out of order: nothing until the start is read
             _slot(world, q, [chain[0], chain[1]], invalid_at=(1,))]  # an invalid turn reads no document
    tree = Tree.empty(3, 128, 6, protocol.PAD)
    tokens, boundaries = np.array(tree.tokens), np.array(tree.boundaries)
    for i, (row, _, ends) in enumerate(slots):
        tokens[i, : len(row)], boundaries[i, : len(ends)] = row, ends
    tree = dataclasses.replace(tree, tokens=tokens, boundaries=boundaries,
                               prompt_len=np.array([s[1] for s in slots], np.int32),
                               num_turns=np.array([len(s[2]) for s in slots], np.int32),
                               question=np.full(3, q, np.int32), prompt=np.zeros(3, np.int32))
    progress = chain_progress(tree, world)
    np.testing.assert_array_equal(progress[0, :4], [1, 2, 3, 3])
    np.testing.assert_array_equal(progress[1, :5], [0, 0, 2, 3, 3])
    np.testing.assert_array_equal(progress[2, :3], [1, 1, 1])
    assert (progress[:, 5] == -1).all() and progress[2, 3] == -1
    slot, turn, states = prefix_states(tree, world)  # non-final turns only
    np.testing.assert_array_equal(slot, [0, 0, 0, 1, 1, 1, 1, 2, 2])
    np.testing.assert_array_equal(states[3:7], [[3, 0, 0], [3, 1, 0], [3, 2, 2], [3, 3, 3]])


def test_state_rate_auc_by_hand():
    from trace_jax.bench.contrast import state_rate_auc

    states = np.array([[0], [0], [1], [1], [1], [2], [0], [1], [2], [3]])
    won = np.array([1, 1, 0, 0, 1, 1, 1, 0, 0, 1], bool)
    held = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1], bool)
    # fitted rates: state 0 -> 1, 1 -> 1/3, 2 -> 1; unseen state 3 -> overall 4/6. Held out: positives score 1 and
    # 2/3, negatives 1/3 and 1: pairs (1 vs 1/3) 1, (1 vs 1) 0.5, (2/3 vs 1/3) 1, (2/3 vs 1) 0
    assert state_rate_auc(states, won, held) == pytest.approx(2.5 / 4)


def test_layer_reads_end_with_what_the_success_head_reads():
    """The last layer's reads are the final normed hidden state the head reads (`warmup.read_hidden`); the earlier
    layer's are the un-normed state after that layer, at the same positions."""
    import dataclasses

    import jax.numpy as jnp

    from trace_jax.bench.contrast import layer_reads
    from trace_jax.train.warmup import read_hidden

    model = init_policy(dataclasses.replace(TINY_POLICY, num_layers=2), 0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TINY_POLICY.vocab_size, (3, 12)), jnp.int32)
    positions = jnp.array([[0, 5, 11], [3, 3, 7], [11, 2, 1]], jnp.int32)
    reads = np.asarray(layer_reads(model, tokens, positions))
    assert reads.shape == (3, 2, 3, TINY_POLICY.hidden_size)
    np.testing.assert_allclose(reads[:, 1], read_hidden(model, tokens, positions), atol=1e-5)
    x = jnp.take(model.embed_tokens[...], tokens, axis=0)
    first, _ = model.layers[0](x, jnp.broadcast_to(jnp.arange(12), (3, 12)), None, None)
    np.testing.assert_allclose(reads[:, 0], np.take_along_axis(np.asarray(first), np.asarray(positions)[..., None],
                                                               axis=1), atol=1e-5)


def test_tower_learns_what_its_read_position_sees_and_nothing_it_does_not():
    """Outcomes set by the token at each slot's first turn boundary: the fitted tower (a predictor layer of its own)
    ranks the held-out slots' turn nodes by it (AUC > 0.9), and scores their prompt nodes, which are read before that
    token, at chance. So it reads each node at its own position, causally, and is scored on slots it was not fitted
    on; and the base policy is left as it was."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from toy import make_tree
    from trace_jax.bench.contrast import tower_report

    s, width = 256, 32
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, TINY_POLICY.vocab_size, (s, width)).astype(np.int32)
    tokens[:, 9] = rng.integers(0, 8, s)  # the first turn ends at 10: its node is read at 9
    won = tokens[:, 9] < 4
    tree = make_tree(np.arange(s), np.full(s, 2), won, width=width)
    tree = dataclasses.replace(tree, tokens=jnp.asarray(tokens), prompt_len=jnp.full((s,), 4, jnp.int32))
    held = np.arange(s) % 4 == 0
    base = init_policy(TINY_POLICY, 0)
    before = jax.tree.map(np.array, nnx.state(base))
    r = tower_report(base, tree, held, batch=64, steps=120, learning_rate=1e-2)
    assert r["prefix_auc_tower"] > 0.9
    assert 0.35 < r["root_auc_tower"] < 0.65
    jax.tree.map(np.testing.assert_array_equal, nnx.state(base), before)  # the fit leaves the base policy as it was


def test_probes_find_linear_and_nonlinear_signal():
    """A logistic probe finds a label linear in one feature and misses an XOR of two; the MLP probe finds both."""
    from trace_jax.bench.contrast import probe_auc

    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 6)).astype(np.float32)
    held = np.arange(800) % 4 == 0
    linear = x[:, 2] + 0.3 * rng.normal(size=800) > 0
    xor = (x[:, 0] > 0) ^ (x[:, 1] > 0)
    assert probe_auc(x, linear, held) > 0.9
    assert probe_auc(x, xor, held) < 0.65
    assert probe_auc(x, xor, held, hidden=64) > 0.85


@pytest.mark.slow  # the figures' arithmetic is tested above; this runs the command end to end at a tiny size
def test_contrast_bench_runs_end_to_end(tmp_path, capsys):
    from flax import nnx

    from toy import TINY_WORLD, trained_policy_state
    from trace_jax.checkpoints import save_model
    from trace_jax.cli import main

    save_model(tmp_path / "base", 0, nnx.merge(*trained_policy_state(400)))  # mixed outcomes: AUCs are defined
    w = TINY_WORLD
    args = [f"world.seed={w.seed}", f"world.num_entities={w.num_entities}", f"world.num_questions={w.num_questions}",
            f"world.max_turns={w.max_turns}", "pool_size=4", "roots=4", "continuations=1",
            "group_size=2", "eval_batch=16", "warmup.batches=1", "warmup.fit_steps=20",
            f"init_checkpoint={tmp_path / 'base'}", f"data_dir={tmp_path / 'tfds'}"]
    assert main(["bench", "contrast", *args, "--samples", "3", "--group", "2", "--probes",
                 "--tower-steps", "3"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"probes of the base policy .*: layer 1 [\d.]+, all layers [\d.]+, MLP on all layers [\d.]+",
                     printed)
    assert re.search(r"top layer .* \(3 minibatches\): prefix AUC [\d.]+ on the held-out quarter \([\d.]+ on the "
                     r"questions it was fitted on\), root AUC [\d.]+; the turn nodes' world state scores [\d.]+",
                     printed)
    assert re.search(r"fitted on the training split's \d+ questions x 2 episodes: prefix AUC [\d.]+ on the test "
                     r"questions' episodes \([\d.]+ on the training questions'\), root AUC [\d.]+", printed)
    assert "mixed groups of 2" in printed and "warmed-up head" in printed
    assert re.search(r"perfect predictor of each question's success rate [\d.]+ ± [\d.]+ \(rates ~ Beta", printed)
    assert re.search(r"prefix AUC over \d+ turn nodes of the held-out episodes: .* [\d.]+, warmed-up head [\d.]+",
                     printed)


def test_the_bench_says_when_its_policy_is_a_random_one(tmp_path):
    """Without the SFT checkpoint the bench runs a random policy of the same size, whose episodes (and so the tree,
    expansion and update figures) differ: its output must say so, and how to build the checkpoint."""
    from trace_jax.config import SFTConfig

    model, which = hopworld_policy(str(tmp_path / "missing"))
    assert model.cfg == SFTConfig().model
    assert "random init" in which and "missing" in which and "trace-jax sft" in which


def test_form_rates_leave_the_question_out():
    from trace_jax.bench.contrast import contrast_figures, form_rates

    # forms: questions 0-2 share form 0, question 3 is alone in form 1; 2 seen episodes each
    seen = np.array([[1, 1], [1, 0], [0, 0], [1, 1]], bool)
    rates = form_rates(seen, np.array([0, 0, 0, 1]))
    np.testing.assert_allclose(rates, [1 / 4, 2 / 4, 3 / 4, 5 / 8])  # question 3: the overall rate
    reward = np.concatenate([seen, np.array([[0], [1], [1], [0]], bool)], 1)
    r = contrast_figures(reward, np.ones(4, int), group=2, labels={"form": np.array([0, 0, 0, 1])})
    # held out [0, 1, 1, 0]; scores [1/4, 1/2, 3/4, 5/8]: of the 4 (positive, negative) pairs only (1/2, 5/8) is
    # ordered wrongly
    assert r["auc_form_rate"] == 0.75


def test_habit_misfires_are_what_the_habit_meets():
    """An expert that always has the habit (blind_prob 1, no other mistakes) wins every question on whose chain no
    search misfires and loses most of the others (a wrong document can still lead to the right answer); the labels
    split a form exactly by its misfires."""
    from trace_jax.bench.contrast import habit_misfires, misfire_forms, question_forms
    from trace_jax.envs.hopworld.config import ENTITY_TYPES, HopWorldConfig
    from trace_jax.envs.hopworld.expert import expert_episode
    from trace_jax.envs.hopworld.world import build_world

    cfg = HopWorldConfig(num_entities=128, num_questions=300)
    world = build_world(cfg)
    questions = np.arange(300)
    person = ENTITY_TYPES.index("person")
    misfires = habit_misfires(world, questions, person)
    rng = np.random.default_rng(0)
    won = np.array([expert_episode(world, cfg, int(q), rng, blind_type=person, blind_prob=1.0).reward > 0.5
                    for q in questions])
    clean = misfires.sum(1) == 0
    assert won[clean].all() and clean.sum() > 30
    assert (misfires[:, 0] == 1).sum() > 30 and (misfires[:, 1] > 0).sum() > 10
    assert won[~clean].mean() < 0.3
    keys = [(f, *m) for f, m in zip(question_forms(world, questions).tolist(), misfires.tolist())]
    labels = misfire_forms(world, questions, person)
    for i in range(0, 300, 7):
        for j in range(300):
            assert (labels[i] == labels[j]) == (keys[i] == keys[j])


def test_retriever_bench_runs(capsys):
    """`trace-jax bench retriever` (docs/search_qa.md) at a tiny corpus: its three rows, in process and over HTTP."""
    from trace_jax.cli import main

    assert main(["bench", "retriever", "--passages", "500", "--seconds", "0.2", "--clients", "2"]) == 0
    printed = capsys.readouterr().out
    for row in (r"in process \(no HTTP\): +\d+ queries/s", r"HTTP, 1 client: +\d+ queries/s",
                r"HTTP, 2 concurrent clients: +\d+ queries/s \([\d.]+x one client\)"):
        assert re.search(row, printed), row


def test_host_bench_runs(tmp_path, capsys):
    """`trace-jax bench host` (docs/search_qa.md) on a tiny random policy: both expansions timed, the overhead
    derived."""
    from trace_jax.checkpoints import save_model
    from trace_jax.cli import main

    save_model(tmp_path / "policy", 0, init_policy(TINY_POLICY, seed=0))
    assert main(["bench", "host", "--checkpoint", str(tmp_path / "policy"), "--pool-size", "4", "--roots", "4",
                 "--repeats", "1"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"jitted expansion \(JAX env inside\): +[\d.]+ ms", printed)
    assert re.search(r"host-path overhead \(tool excluded\): +-?[\d.]+ ms = -?[\d.]+ ms per turn", printed)
