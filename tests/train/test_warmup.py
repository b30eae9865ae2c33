"""Predictor warm-up: readings are the sampler's own V~ inputs, the fit minimises the log loss correctly, only the
head moves, and the held-out report is what its nodes say."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from toy import tiny_env, trained_policy
from trace_jax.allocation import Allocator, Plan
from trace_jax.envs.hopworld import protocol
from trace_jax.evaluate import question_pool
from trace_jax.models import with_predictor_layers
from trace_jax.models.qwen3 import Policy
from trace_jax.objectives import node_targets
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import expand_tree
from trace_jax.train.warmup import (
    Readings,
    WarmupSpec,
    _batched,
    _predictor_input,
    episode_nodes,
    episode_values,
    fit_head,
    fit_own_layers,
    quality,
    tree_episodes,
    tree_readings,
    warm_up_predictor,
)


def test_fit_head_recovers_a_logistic_model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 6)).astype(np.float32)
    k, b = rng.normal(size=6).astype(np.float32), np.float32(-0.3)
    target = 1 / (1 + np.exp(-(x @ k + b)))  # soft targets: the log loss is at its minimum (their entropy) at (k, b)
    data = Readings(features=x, target=target, outcome=target, is_root=np.zeros(4000, bool),
                    question=np.zeros(4000, np.int32))
    kernel, bias = fit_head(jnp.zeros(6), jnp.zeros(()), data, steps=3000, learning_rate=0.05)
    np.testing.assert_allclose(kernel, k, atol=0.05)
    np.testing.assert_allclose(bias, b, atol=0.05)


def test_fit_head_does_not_saturate_on_mostly_solved_prompts():
    """Hidden states share a large common direction; with 95% successes a squared-error fit on the sigmoid
    pushed every logit past float32's saturation within a few Adam steps and stayed at V~ = 1 everywhere (seen in
    a warm-up on the contrast-poor world). The log-loss fit keeps V~ at the success rate."""
    rng = np.random.default_rng(0)
    x = (3.0 + 0.3 * rng.normal(size=(900, 128))).astype(np.float32)
    y = (rng.random(900) < 0.95).astype(np.float32)
    data = Readings(features=x, target=y, outcome=y, is_root=np.zeros(900, bool), question=np.zeros(900, np.int32))
    kernel, bias = fit_head(jnp.zeros(128), jnp.zeros(()), data, steps=500, learning_rate=0.01)
    v = np.asarray(jax.nn.sigmoid(x @ kernel + bias))
    assert abs(v.mean() - y.mean()) < 0.03 and (v < 0.999).all()


def test_the_held_out_report_is_what_its_nodes_say():
    """quality(): each kind's AUC is the pairwise count over its nodes, with its interval around it, and the nodes
    and questions it rests on are counted (the warm-up prints them: 29 prompt nodes make a wide interval)."""
    rng = np.random.default_rng(0)
    question = rng.integers(0, 30, 200)
    is_root = rng.uniform(size=200) < 0.3
    pred = rng.uniform(size=200).astype(np.float32)
    outcome = (rng.uniform(size=200) < pred).astype(np.float32)
    data = Readings(features=None, target=outcome, outcome=outcome, is_root=is_root, question=question)
    got = quality(pred, data)
    for name, mask in (("root", is_root), ("prefix", ~is_root)):
        won = outcome[mask] > 0.5
        pos, neg = pred[mask][won], pred[mask][~won]
        assert np.isclose(got[f"{name}_auc"], np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))
        assert got[f"{name}_auc_lo"] < got[f"{name}_auc"] < got[f"{name}_auc_hi"]
        assert got[f"{name}_nodes"] == mask.sum() and got[f"{name}_questions"] == len(set(question[mask]))


def _spec(batches: int) -> WarmupSpec:
    return WarmupSpec(batches=batches, group_size=2, roots=8, continuations=2, fit_steps=200, learning_rate=0.05,
                      sampling=SamplingConfig(temperature=0.8), pad_id=protocol.PAD)


def test_warm_up_fits_only_the_head_on_the_samplers_readings():
    env = tiny_env()
    model = trained_policy()
    model.success_kernel[...] = jax.random.normal(jax.random.key(1), model.success_kernel.shape) * 0.3
    before = jax.tree.map(np.array, nnx.state(model))
    pools = lambda i: question_pool(env, np.arange(8 * i, 8 * i + 8) % env.world.num_questions)
    # the readings' features are the hidden states the sampler read V~ from: the head on them gives tree.success
    plan = Plan(Allocator("uniform_tree", group_size=2), roots=8, continuations=2)
    tree, _, _ = expand_tree(model, env, pools(0), jax.random.key(0), plan=plan, sampling=SamplingConfig(0.8),
                             pad_id=protocol.PAD)
    r = tree_readings(model, tree)
    assert r.is_root.sum() >= 4 and (~r.is_root).sum() > r.is_root.sum()
    _, weight = node_targets(tree)
    rows, cols = np.nonzero(np.asarray(weight) > 0)  # tree_readings' order: each distinct node once
    head = np.asarray(model.success_from_hidden(jnp.asarray(r.features)))
    np.testing.assert_allclose(head, np.asarray(tree.success)[rows, cols], atol=1e-4)
    np.testing.assert_array_equal(r.is_root, cols == 0)
    np.testing.assert_array_equal(r.outcome, np.asarray(tree.reward)[rows])

    model, report = warm_up_predictor(model, env, pools, jax.random.key(2), _spec(batches=4))
    after = jax.tree.map(np.array, nnx.state(model))
    leaves = jax.tree_util.tree_leaves_with_path
    for (path, a), (_, b) in zip(leaves(before), leaves(after), strict=True):
        if "success" in jax.tree_util.keystr(path):
            assert not np.array_equal(a, b)
        else:
            np.testing.assert_array_equal(a, b)
    # the toy policy loses (almost) every episode (it wins 0-2.5% of the tiny world's questions at temperature
    # 0.8-1): its AUCs may be undefined (NaN; `auc` is tested against brute force in test_objectives, and on the
    # default SFT base in test_figures)
    for key in ("root_auc", "prefix_auc", "root_ece", "prefix_ece", "root_brier", "prefix_brier"):
        for value in (report[f"warmup/{key}"], report[f"warmup/before/{key}"]):
            assert 0 <= value <= 1 or (key.endswith("auc") and np.isnan(value)), (key, report)
    assert report["warmup/train_nodes"] > 0


def test_warm_up_with_own_layers_fits_only_the_predictor():
    """A predictor with a layer of its own: the episodes' V~ (one forward of the whole slot) are the sampler's
    readings (its cache rows); the fit's split forward equals the whole one; the warm-up moves the predictor's
    layer and head and nothing else; and the fit lowers the log loss of the episodes it was fitted on."""
    env = tiny_env()
    model = with_predictor_layers(trained_policy(), 1)
    model.success_kernel[...] = jax.random.normal(jax.random.key(1), model.success_kernel.shape) * 0.3
    pools = lambda i: question_pool(env, np.arange(8 * i, 8 * i + 8) % env.world.num_questions)
    plan = Plan(Allocator("uniform_tree", group_size=2), roots=8, continuations=2)
    tree, _, _ = expand_tree(model, env, pools(0), jax.random.key(0), plan=plan, sampling=SamplingConfig(0.8),
                             pad_id=protocol.PAD)
    e = tree_episodes(tree)
    nodes, rows, cols = episode_nodes(e)
    assert nodes.is_root.sum() >= 4 and (~nodes.is_root).sum() > nodes.is_root.sum()
    np.testing.assert_allclose(episode_values(model, e, batch=64)[rows, cols],
                               np.asarray(tree.success)[e.slot[rows], cols], atol=1e-5)
    # the fit runs the predictor's layers alone on what the layers below fed them (computed once, in batches that
    # do not divide the slots) over positions cut after the last read: V~'s input there is a whole forward's (on a
    # policy with layers below its top one: the toy has one)
    cut = int(e.reads.max()) + 1
    assert cut < e.tokens.shape[1] and len(e.tokens) % 5
    deep = Policy(dataclasses.replace(model.cfg, num_layers=3, predictor_layers=1), nnx.Rngs(3))
    x = _batched(_predictor_input, deep, (e.tokens[:, :cut],), batch=5)
    np.testing.assert_allclose(deep.predictor_hidden_from(jnp.asarray(x)), deep(e.tokens).predictor_hidden[:, :cut],
                               atol=1e-5)

    def log_loss(m) -> float:
        v = np.clip(episode_values(m, e, batch=64)[rows, cols], 1e-7, 1 - 1e-7)
        return float(-np.mean(nodes.target * np.log(v) + (1 - nodes.target) * np.log(1 - v)))

    before_state, before = jax.tree.map(np.array, nnx.state(model)), log_loss(model)
    fit_own_layers(model, e, steps=20, learning_rate=1e-2, rows=16)
    assert log_loss(model) < before - 0.05
    spec = dataclasses.replace(_spec(batches=3), fit_steps=5)  # minibatches, with own layers
    model, report = warm_up_predictor(model, env, pools, jax.random.key(2), spec)
    after = jax.tree.map(np.array, nnx.state(model))
    moved = set()
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(before_state),
                                 jax.tree_util.tree_leaves_with_path(after), strict=True):
        name = jax.tree_util.keystr(path)
        if "predictor" in name or "success" in name:
            if not np.array_equal(a, b):
                moved.add(path[0].key)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)
    assert moved == {"predictor", "predictor_norm", "success_kernel", "success_bias"}
    assert report["warmup/train_nodes"] > 0 and 0 <= report["warmup/root_ece"] <= 1

