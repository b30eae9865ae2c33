"""Supervised warm-up: a few steps reduce the loss and leave a checkpoint that reloads."""

import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trace_jax import sft
from trace_jax.checkpoints import load_model
from trace_jax.cli import main
from trace_jax.config import SFTConfig, load_config
from trace_jax.data.tokenizer import load_tokenizer
from trace_jax.envs.hopworld import build_world
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.sft import expert_data, make_optimizer, sequence_loss, split_questions
from trace_jax.sharding import init_policy

OVERRIDES = ["steps=12", "batch_size=8", "episodes=64", "learning_rate=0.003", "warmup_steps=2",
             "log_every=4", "eval_batch=16", "world.num_entities=64", "world.num_questions=120",
             "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
             "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=16"]


real_hop_success = sft.hop_success


def test_sft_reduces_loss_and_checkpoint_reloads(tmp_path, capsys, monkeypatch):
    args = OVERRIDES + [f"out_dir={tmp_path / 'run'}", f"data_dir={tmp_path / 'tfds'}", "eval_temperature=0.5"]
    evaluated = []  # the sampling each test-split evaluation ran with
    monkeypatch.setattr(sft, "hop_success", lambda *a: evaluated.append(a[-1]) or real_hop_success(*a))
    assert main(["sft", *args]) == 0
    printed = capsys.readouterr().out
    assert "1 hop" in printed and "checkpoint" in printed and "temperature 0.5" in printed
    assert [s.temperature for s in evaluated] == [0.5]
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["history"]
    assert history[-1]["loss"] < history[0]["loss"]

    cfg = load_config(SFTConfig, None, args)
    model = load_model(tmp_path / "run" / "checkpoints")
    assert model.cfg == cfg.model
    env = HopWorldEnv(build_world(cfg.world), cfg.world)
    tokens, mask, _ = expert_data(cfg, env, split_questions(cfg, "validation"))
    loss = nnx.jit(sequence_loss)  # one program (eagerly, each of the forward's ops would compile on its own)
    trained = float(loss(model, jnp.asarray(tokens), jnp.asarray(mask)))
    fresh = float(loss(init_policy(cfg.model, seed=123), jnp.asarray(tokens), jnp.asarray(mask)))
    assert trained < fresh
    assert load_tokenizer(tmp_path / "run" / "tokenizer").vocab_size == cfg.model.vocab_size
    assert np.isfinite(trained)


def test_weight_decay_reaches_the_optimizer():
    """With zero gradients AdamW's step is its decay alone: every parameter scales by 1 - lr x weight_decay (the
    first step is at the peak rate without a warm-up)."""
    for decay in (0.0, 0.1):
        cfg = load_config(SFTConfig, None, OVERRIDES + ["warmup_steps=0", f"weight_decay={decay}"])
        model = init_policy(cfg.model, seed=0)
        before = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))
        optimizer = make_optimizer(model, cfg)
        nnx.jit(lambda m, o, g: o.update(m, g))(model, optimizer, jax.tree.map(jnp.zeros_like, before))
        factor = 1 - cfg.learning_rate * decay
        scaled = jax.tree.map(lambda p, f=factor: p * f, before)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), nnx.state(model, nnx.Param), scaled)
