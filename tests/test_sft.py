"""Supervised warm-up: a few steps reduce the loss and leave a checkpoint that reloads."""

import json

import jax.numpy as jnp
import numpy as np
from flax import nnx

from trace_jax.checkpoints import load_model
from trace_jax.cli import main
from trace_jax.config import SFTConfig, load_config
from trace_jax.data.tokenizer import load_tokenizer
from trace_jax.envs.hopworld import build_world
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.sft import expert_data, sequence_loss, split_questions
from trace_jax.sharding import init_policy

OVERRIDES = ["steps=12", "batch_size=8", "episodes=64", "learning_rate=0.003", "warmup_steps=2",
             "log_every=4", "eval_batch=16", "world.num_entities=64", "world.num_questions=120",
             "model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
             "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=16"]


def test_sft_reduces_loss_and_checkpoint_reloads(tmp_path, capsys):
    args = OVERRIDES + [f"out_dir={tmp_path / 'run'}", f"data_dir={tmp_path / 'tfds'}"]
    assert main(["sft", *args]) == 0
    printed = capsys.readouterr().out
    assert "1 hop" in printed and "checkpoint" in printed
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
