"""Smoke test of the sampler benchmark's measurements on a tiny model (speed is not asserted)."""

from trace_jax.bench import sampler_tokens_per_s, tree_fork_vs_reprefill
from trace_jax.envs.hopworld import HopWorldConfig, build_world
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.envs.hopworld.vocab import VOCAB_SIZE
from trace_jax.models import ModelConfig
from trace_jax.sharding import init_policy

CFG = ModelConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                  num_kv_heads=1, head_dim=16, rope_theta=1e4)


def test_fork_benchmark_counts_and_utilisation():
    wcfg = HopWorldConfig(seed=4, num_entities=64, num_questions=60, max_hops=2, max_turns=3)
    r = tree_fork_vs_reprefill(init_policy(CFG, 0), HopWorldEnv(build_world(wcfg), wcfg), num_prompts=2,
                               roots_per_prompt=2, n=2)
    assert 0 < r["positions_fork"] < r["positions_reprefill"]
    assert 0 < r["utilisation_roots"] <= 1 and 0 < r["utilisation_continuations"] <= 1
    tokens_per_s, _ = sampler_tokens_per_s(init_policy(CFG, 0), batch=4, prompt_len=5, steps=6)
    assert tokens_per_s > 0
