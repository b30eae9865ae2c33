"""The counter toy as a task family (docs/adding_a_task.md walks through it): `env=counter_family:FAMILY`.

A tiny random Qwen3 policy over the counter's dozen tokens calls a stateful tool (`counter_env.CounterEnv`) through
the host path; its settings are the run's `task:` section (`CounterConfig`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
from counter_env import CounterEnv

from trace_jax.allocation import one_episode_per_prompt
from trace_jax.checkpoints import load_model, save_model
from trace_jax.envs.family import Evaluation, Family, TurnShape, task_section
from trace_jax.models import ModelConfig
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.host import expand_host
from trace_jax.sharding import init_policy, rows_on


@dataclasses.dataclass(frozen=True)
class CounterConfig:
    questions: int = 64  # targets drawn in [0, max_turns): the first three quarters train, the rest evaluate
    max_turns: int = 4  # T: calls per episode at most


def policy_model(cfg, preset=None) -> tuple[ModelConfig, str]:
    turns = task_section(cfg, FAMILY).max_turns
    return ModelConfig(vocab_size=CounterEnv([], turns).vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=16), "tests/counter_family.py"


class CounterTask:
    host, pad_id = True, 0

    def __init__(self, cfg):
        self.cfg, c = cfg, task_section(cfg, FAMILY)
        self.env = CounterEnv(np.random.default_rng(0).integers(0, c.max_turns, c.questions), c.max_turns)
        self.train_ids, self.test_ids = np.split(np.arange(c.questions), [c.questions * 3 // 4])

    def pool(self, step, mesh, stream=0):
        draw = np.random.default_rng([self.cfg.seed, stream, step]).choice(self.train_ids, self.cfg.pool_size)
        return rows_on(self.env.pool(draw), mesh)

    def warmup_pool(self, batch, mesh):
        return self.pool(batch, mesh, stream=1)

    def base_policy(self, mesh):
        return init_policy(policy_model(self.cfg)[0], seed=self.cfg.seed)

    def evaluate(self, model, step, mesh):
        key = jax.random.fold_in(jax.random.key(self.cfg.seed + 7), step)
        tree, _, _ = expand_host(model, self.env, self.env.pool(self.test_ids), key,
                                 plan=one_episode_per_prompt(len(self.test_ids)), sampling=SamplingConfig(1.0),
                                 pad_id=self.pad_id)
        return Evaluation(metrics={"eval/success": float(np.mean(tree.reward))})

    def save_policy(self, model, out_dir):
        save_model(Path(out_dir) / "policy", self.cfg.steps, model)
        return Path(out_dir) / "policy"

    def load_policy(self, path):
        return load_model(path)


FAMILY = Family(name="counter", setup=CounterTask, policy_model=policy_model, config=CounterConfig,
                turn_shape=lambda cfg: TurnShape(2, task_section(cfg, FAMILY).max_turns, 3, 2),
                plot_keys=("reward", "effective_ratio", "eval/success"))
