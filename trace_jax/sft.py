"""Supervised warm-up: train the HopWorld policy on scripted expert episodes (with mistakes).

The result is the base policy RL starts from: competent but imperfect, so that outcomes vary
across prompts and across turns.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import yaml
from flax import nnx
from tqdm.auto import tqdm

from trace_jax.checkpoints import save_model
from trace_jax.config import SFTConfig, to_dict
from trace_jax.data.hopworld_tfds import build_dataset, read_split
from trace_jax.envs.hopworld import build_world, protocol, vocab
from trace_jax.envs.hopworld.config import ENTITY_TYPES
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.envs.hopworld.expert import expert_episode, flatten
from trace_jax.evaluate import hop_success
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.sampling import token_logprobs
from trace_jax.sharding import init_policy

BUCKET = 64  # batches are padded to a multiple of this many tokens (few compilations)


def split_questions(cfg: SFTConfig, split: str) -> np.ndarray:
    """Question ids of a split of the HopWorld TFDS dataset (built under data_dir if missing)."""
    try:
        examples = read_split(cfg.data_dir, cfg.world, split)
    except FileNotFoundError:
        build_dataset(cfg.data_dir, cfg.world)
        examples = read_split(cfg.data_dir, cfg.world, split)
    return np.sort(np.asarray([int(ex["question_id"]) for ex in examples], np.int32))


def expert_data(cfg: SFTConfig, env: HopWorldEnv, questions: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [N, L], loss mask [N, L], lengths [N]) of cfg.episodes expert episodes."""
    rng = np.random.default_rng(cfg.seed)
    order = rng.permutation(questions)
    blind_type = ENTITY_TYPES.index(cfg.blind_spot) if cfg.blind_spot else -1
    seqs = []
    for i in tqdm(range(cfg.episodes), desc="expert episodes", leave=False):
        ep = expert_episode(env.world, env.cfg, int(order[i % len(order)]), rng, cfg.mistake_prob,
                            cfg.wrong_answer_prob, blind_type, cfg.blind_spot_prob)
        seqs.append(flatten(ep))
    width = -(-max(len(t) for t, _ in seqs) // BUCKET) * BUCKET
    tokens = np.full((len(seqs), width), protocol.PAD, np.int32)
    mask = np.zeros((len(seqs), width), np.float32)
    lengths = np.zeros(len(seqs), np.int32)
    for i, (t, m) in enumerate(seqs):
        tokens[i, : len(t)], mask[i, : len(m)], lengths[i] = t, m, len(t)
    return tokens, mask, lengths


def sequence_loss(model: Policy, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over masked targets. tokens, mask [B, L]."""
    target_logp = token_logprobs(model(tokens[:, :-1]).logits, tokens[:, 1:])
    weights = mask[:, 1:]
    return -(target_logp * weights).sum() / jnp.maximum(weights.sum(), 1.0)


@nnx.jit
def train_step(model: Policy, optimizer: nnx.Optimizer, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    loss, grads = nnx.value_and_grad(sequence_loss)(model, tokens, mask)
    optimizer.update(model, grads)
    return loss


def make_optimizer(model: Policy, cfg: SFTConfig) -> nnx.Optimizer:
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, cfg.warmup_steps, cfg.steps,
                                                  end_value=cfg.learning_rate * 0.1)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=cfg.weight_decay))
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


def run_sft(cfg: SFTConfig) -> dict[str, float]:
    """Train, checkpoint, and evaluate on the test split; returns the final metrics."""
    if cfg.model.vocab_size != vocab.VOCAB_SIZE:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} but the HopWorld vocabulary has "
                         f"{vocab.VOCAB_SIZE} tokens; set model.vocab_size={vocab.VOCAB_SIZE}")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    from trace_jax.data.tokenizer import build_tokenizer  # transformers (and PyTorch, where installed): only here

    build_tokenizer(out / "tokenizer")
    env = HopWorldEnv(build_world(cfg.world), cfg.world)
    tokens, mask, lengths = expert_data(cfg, env, split_questions(cfg, "train"))
    print(f"sft: {len(tokens)} expert episodes, {int(mask.sum())} policy tokens, "
          f"longest {int(lengths.max())} tokens")

    model = init_policy(cfg.model, cfg.seed)
    optimizer = make_optimizer(model, cfg)
    rng = np.random.default_rng(cfg.seed + 1)
    history = []
    bar = tqdm(range(1, cfg.steps + 1), desc="sft")
    for step in bar:
        rows = rng.choice(len(tokens), cfg.batch_size, replace=False)
        width = -(-int(lengths[rows].max()) // BUCKET) * BUCKET
        loss = float(train_step(model, optimizer, jnp.asarray(tokens[rows, :width]),
                                 jnp.asarray(mask[rows, :width])))
        bar.set_postfix(loss=f"{loss:.3f}")
        if step % cfg.log_every == 0 or step == cfg.steps:
            history.append({"step": step, "loss": loss})
    save_model(out / "checkpoints", cfg.steps, model)

    test = split_questions(cfg, "test")
    metrics = hop_success(model, env, test, cfg.eval_batch, jax.random.key(cfg.seed),
                          SamplingConfig(temperature=cfg.eval_temperature))
    metrics["final_loss"] = history[-1]["loss"]
    (out / "metrics.json").write_text(json.dumps({"final": metrics, "history": history}, indent=2))
    print(format_success(metrics, len(test), cfg.eval_temperature))
    print(f"sft: checkpoint {out / 'checkpoints'}, tokenizer {out / 'tokenizer'}, metrics {out / 'metrics.json'}")
    return metrics


def format_success(metrics: dict[str, float], n: int, temperature: float) -> str:
    """A small table of success overall and per hop count."""
    lines = [f"test success ({n} questions, one sampled episode each, temperature {temperature}):"]
    for key, value in metrics.items():
        if key.startswith("success"):
            label = "overall" if key == "success" else key.replace("success_hop", "") + " hop"
            lines.append(f"  {label:>8}: {100 * value:5.1f}%")
    return "\n".join(lines)
