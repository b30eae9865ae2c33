"""Smoke test of the sampler benchmark's measurements on a tiny model (speed is not asserted)."""

import numpy as np
import pytest

from toy import TINY_POLICY, tiny_env
from trace_jax.bench.sampler import (
    decode_flops_per_token,
    dot_flops_per_s,
    sampler_tokens_per_s,
    tree_fork_vs_reprefill,
)
from trace_jax.envs.hopworld import HopWorldConfig
from trace_jax.models import ModelConfig
from trace_jax.sharding import init_policy


@pytest.mark.slow  # the counting contract is tested in tests/rollout/test_expand.py; this smoke-runs the bench
def test_fork_benchmark_counts_and_utilisation():
    wcfg = HopWorldConfig(seed=4, num_entities=64, num_questions=60, max_hops=2, max_turns=3)
    r = tree_fork_vs_reprefill(init_policy(TINY_POLICY, 0), tiny_env(wcfg), num_prompts=2, roots_per_prompt=2, n=2,
                               repeats=1)
    assert r["slot_len_fork"] == r["slot_len_reprefill"]
    assert 0 < r["useful_fork"] < r["useful_reprefill"] and r["useful_fork"] <= r["processed_fork"]
    assert 0 < r["processed_fork"] < r["processed_reprefill"]
    assert 0 < r["utilisation_roots"] <= 1 and 0 < r["utilisation_continuations"] <= 1
    tokens_per_s, _ = sampler_tokens_per_s(init_policy(TINY_POLICY, 0), batch=4, prompt_len=5, steps=6, repeats=2)
    assert tokens_per_s.shape == (2,) and (tokens_per_s > 0).all()


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


def test_decode_flops_count_every_projection_and_the_attention_by_hand():
    cfg = ModelConfig(vocab_size=10, hidden_size=4, intermediate_size=6, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=3)
    # per layer: q 4x6, k 4x3, v 4x3, o 6x4 -> 72; MLP 3 x 4x6 -> 72; scores and sum over 5 positions, 6 wide -> 60
    assert decode_flops_per_token(cfg, context=5) == 2 * (2 * (72 + 72 + 60) + 4 * 10)
    rates = dot_flops_per_s(8, cfg, repeats=2)
    assert rates.shape == (2,) and (rates > 0).all()
