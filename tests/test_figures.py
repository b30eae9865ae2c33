"""Checks of figures the docs quote (slow tier: `pytest -m slow`). The figures themselves come from
the commands printed beside them in the docs; these tests hold the claims made about them."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from built_once import built_once, session_tmp
from test_allocation import check_root_counts

from trace_jax.allocation import root_counts
from trace_jax.bench.sampler import tree_fork_vs_reprefill
from trace_jax.config import SFTConfig
from trace_jax.envs.hopworld import HopWorldConfig, build_world
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.sft import run_sft, split_questions
from trace_jax.sharding import init_policy

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("num_prompts, distinct", [(256, 3), (256, 40), (512, 5)])
def test_stage1_is_exact_at_the_papers_scale(num_prompts, distinct):
    """B = 256-512 prompts, M = 1024 roots, duplicate-heavy pools, against the float64 reference DP."""
    rng = np.random.default_rng(num_prompts + distinct)
    v = rng.choice(np.r_[0.16, 0.56, 0.6633085, rng.uniform(size=distinct)], num_prompts).astype(np.float32)
    m = np.asarray(jax.jit(root_counts, static_argnums=1)(jnp.asarray(v), 1024))
    check_root_counts(v, m, 1024)


@pytest.mark.parametrize("n, processed_saved, useful_saved", [(2, 0.25, 0.4), (6, 0.33, 0.5)])
def test_forks_save_positions_at_the_benchmarks_setting(n, processed_saved, useful_saved):
    """`trace-jax bench sampler`'s tree setting: 8 prompts x 4 roots, 3-turn HopWorld, HopWorld-size policy."""
    wcfg = HopWorldConfig(max_hops=2, max_turns=3, num_questions=512)
    r = tree_fork_vs_reprefill(init_policy(SFTConfig().model, 0), HopWorldEnv(build_world(wcfg), wcfg),
                               num_prompts=8, roots_per_prompt=4, n=n, repeats=1)
    assert r["slot_len_fork"] == r["slot_len_reprefill"]
    assert 1 - r["processed_fork"] / r["processed_reprefill"] >= processed_saved
    assert 1 - r["useful_fork"] / r["useful_reprefill"] >= useful_saved


def _default_sft_config(root: Path) -> SFTConfig:
    return dataclasses.replace(SFTConfig(), out_dir=str(root / "sft"), data_dir=str(root / "tfds"))


@pytest.fixture(scope="module")
def default_sft(tmp_path_factory):
    """(final metrics, TrainConfig pointing at it) of the default SFT recipe, trained once per session: this module's
    tests run on every worker, and each worker's own build took as long as the rest of the tier."""
    from trace_jax.config import TrainConfig

    root = built_once(session_tmp(tmp_path_factory), "default_sft", lambda path: run_sft(_default_sft_config(path)))
    cfg = _default_sft_config(root)
    train_cfg = dataclasses.replace(TrainConfig(), init_checkpoint=str(root / "sft" / "checkpoints"),
                                    data_dir=cfg.data_dir, eval_samples=4)
    return json.loads((root / "sft" / "metrics.json").read_text())["final"], train_cfg


def test_default_sft_policy_is_competent_but_imperfect(default_sft):
    """The SFT table (docs/hopworld.md) (54.6-57.6% overall on two machines): the default recipe lands in a band."""
    metrics, _ = default_sft
    assert 0.45 <= metrics["success"] <= 0.7
    assert metrics["success_hop1"] > metrics["success_hop4"]


def test_warm_up_lifts_root_auc_on_held_out_prompts(default_sft):
    """The warm-up figures (docs/predictor.md): V~ = 0.5 everywhere (AUC 0.5) before; after, on the test split, the
    reads separate outcomes and spread over prompts. The bars are what the linear head has measured since the warm-up
    holds out whole questions (root AUC 0.528 and 0.538 on two SFT builds, prefix 0.594; 820 episodes: a standard
    error of about 0.02), not the issue's 0.65: the head is below the 0.656 a predictor knowing each question's
    success rate would score (`trace-jax bench contrast`), and that gap is open."""
    from trace_jax.envs.hopworld.family import HopWorldTask, evaluate
    from trace_jax.train.loop import warm_up

    _, cfg = default_sft
    task = HopWorldTask(cfg)
    model = task.base_policy(None)
    report = warm_up(cfg, model, task.env, lambda i: task.warmup_pool(i, None), task.pad_id)
    assert report["warmup/before/root_auc"] == 0.5
    scores = evaluate(model, task.env, split_questions(dataclasses.replace(SFTConfig(), data_dir=cfg.data_dir),
                                                       "test"), cfg, 0).metrics
    assert scores["eval/root_auc"] > 0.52 and scores["eval/prefix_auc"] > 0.54, scores
    assert scores["eval/root_v_std"] > 0.05 and scores["eval/root_ece"] < 0.1, scores


def test_a_predictor_layer_lifts_root_auc_above_0_6(default_sft):
    """The figures (docs/predictor.md) for `configs/hopworld_predictor_layer.yaml` (the issue's check: the warm-up moves
    root AUC above 0.6 on the default world): a layer of the predictor's own, warmed up on 1,600 prompts, reads what the
    linear head does not. Measured 0.607 root and 0.657 prefix AUC on the test split, V~ spread 0.111, root ECE 0.030
    (an earlier fit of the same recipe: 0.615 and 0.656); 341 s of warm-up on 2 cores. The spread's bar is below the
    issue's 0.10: on another SFT build (2026-12-03) it measured 0.089, with root and prefix AUC above their bars."""
    from trace_jax.config import TrainConfig, load_config
    from trace_jax.envs.hopworld.family import HopWorldTask
    from trace_jax.train.loop import warm_up

    _, base = default_sft
    cfg = load_config(TrainConfig, "configs/hopworld_predictor_layer.yaml",
                      [f"init_checkpoint={base.init_checkpoint}", f"data_dir={base.data_dir}", "eval_samples=4"])
    task = HopWorldTask(cfg)
    model = task.base_policy(None)
    warm_up(cfg, model, task.env, lambda i: task.warmup_pool(i, None), task.pad_id)
    scores = task.evaluate(model, 0, None).metrics
    assert scores["eval/root_auc"] > 0.6 and scores["eval/prefix_auc"] > 0.62, scores
    assert scores["eval/root_v_std"] > 0.08 and scores["eval/root_ece"] < 0.05, scores
