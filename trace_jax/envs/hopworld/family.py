"""HopWorld as a task family: the world's TFDS questions, its JAX environment (rolled out inside the compiled step),
the SFT base policy (trained on expert episodes when missing) and test-split success per hop count with the
predictor's quality on it. Settings: the run's `world:` and `sft:` sections and `init_checkpoint`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from trace_jax import distributed
from trace_jax.checkpoints import checkpoint_path, load_model, save_model
from trace_jax.config import TrainConfig
from trace_jax.data.global_pool import global_pool
from trace_jax.data.hopworld_tfds import build_dataset
from trace_jax.data.loader import hopworld_loader
from trace_jax.envs.family import Evaluation, Family, TurnShape
from trace_jax.envs.hopworld import build_world, protocol
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.evaluate import predictor_quality, rollout_questions, success_by_hops
from trace_jax.models.config import ModelConfig
from trace_jax.models.qwen3 import Policy, with_predictor_layers
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool
from trace_jax.sft import run_sft, split_questions

PLOT_KEYS = ("reward", "effective_ratio", "eval/success", "eval/success_hop1", "eval/success_hop4", "predictor_loss",
             "root_auc", "prefix_auc", "eval/root_auc", "eval/prefix_auc", "root_ece", "eval/root_ece", "pool_v_std",
             "generated_tokens", "entropy", "utilisation", "prompts", "stage2_unplaced", "update_positions")


def base_policy(cfg: TrainConfig) -> Policy:
    """The SFT policy RL starts from, trained first (with cfg.sft settings) if it does not exist yet."""
    path = checkpoint_path(cfg.init_checkpoint)  # may be gs://: a multi-host run's hosts all read it
    if not path.exists() and jax.process_count() > 1:
        raise FileNotFoundError(f"no base policy at {path}: a multi-host run starts from one; train it first "
                                "(`trace-jax sft`) and set init_checkpoint to a path every host reads (gs://...)")
    if not path.exists():
        if path.name != "checkpoints":  # `run_sft` saves into <its out_dir>/checkpoints
            raise FileNotFoundError(f"no base policy at {path}, and it cannot be built there: an SFT run keeps its "
                                    "checkpoints in <out_dir>/checkpoints; set init_checkpoint="
                                    f"{path}/checkpoints to build one in {path}")
        print(f"train: no base policy at {path}; training it now (trace-jax sft)")
        run_sft(dataclasses.replace(cfg.sft, world=cfg.world, data_dir=cfg.data_dir, out_dir=str(path.parent)))
    return load_model(path)


def split_question_ids(cfg: TrainConfig, split: str) -> np.ndarray:
    """The question ids of `split` of cfg's world (as SFT split them)."""
    return split_questions(dataclasses.replace(cfg.sft, world=cfg.world, data_dir=cfg.data_dir), split)


def held_out_questions(cfg: TrainConfig) -> np.ndarray:
    """The test split's question ids of cfg's world (what the evaluation scores)."""
    return split_question_ids(cfg, "test")


def pool_of(batch: dict[str, np.ndarray]) -> Pool:
    return Pool(tokens=jnp.asarray(batch["prompt_ids"]), lengths=jnp.asarray(batch["prompt_len"]),
                question=jnp.asarray(batch["question_id"]))


def evaluate(model: Policy, env: HopWorldEnv, questions: np.ndarray, cfg: TrainConfig, step: int,
             mesh: Mesh | None = None) -> Evaluation:
    """Test success per hop over eval_samples episodes of each question, and the predictor's quality on them."""
    questions = np.repeat(questions, cfg.eval_samples)
    sampling = SamplingConfig(cfg.temperature, cfg.top_p, cfg.draw)
    tree = rollout_questions(model, env, questions, cfg.eval_batch, jax.random.fold_in(jax.random.key(cfg.seed + 7),
                             step), sampling, progress=distributed.is_main(), mesh=mesh)
    scores, bins = predictor_quality(tree)
    out = success_by_hops(tree.reward, np.asarray(env.world.hops)[questions]) | scores
    return Evaluation(metrics={f"eval/{k}": v for k, v in out.items()}, reliability=bins)


class HopWorldTask:
    """One run on cfg's HopWorld (`envs.family.Task`)."""

    host = False
    pad_id = protocol.PAD

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.env = HopWorldEnv(build_world(cfg.world), cfg.world)
        distributed.main_first("dataset", lambda: build_dataset(cfg.data_dir, cfg.world))
        self.loader = hopworld_loader(cfg.data_dir, cfg.world, "train", cfg.pool_size, cfg.seed)
        self.warmup_loader = hopworld_loader(cfg.data_dir, cfg.world, "train", cfg.pool_size, cfg.seed + 1)
        self.questions = held_out_questions(cfg)

    def pool(self, step: int, mesh: Mesh | None) -> Pool:
        batch = max(step - 1, 0)  # the equal-cost probe (step 0) draws step 1's pool
        return pool_of(self.loader.batch(batch)) if mesh is None else global_pool(self.loader, batch, mesh)

    def warmup_pool(self, batch: int, mesh: Mesh | None) -> Pool:
        return pool_of(self.warmup_loader.batch(batch))

    def base_policy(self, mesh: Mesh | None) -> Policy:
        return with_predictor_layers(base_policy(self.cfg), self.cfg.predictor_layers)

    def evaluate(self, model: Policy, step: int, mesh: Mesh | None) -> Evaluation:
        return evaluate(model, self.env, self.questions, self.cfg, step, mesh)

    def save_policy(self, model: Policy, out_dir: Path) -> Path:
        path = Path(out_dir) / "policy"  # `trace-jax export` writes it as an HF checkpoint
        save_model(path, self.cfg.steps, model)
        return path

    def load_policy(self, path: Path) -> Policy:
        return load_model(path)


def turn_shape(cfg: TrainConfig) -> TurnShape:
    w = cfg.world
    return TurnShape(w.prompt_len, w.max_turns, w.action_len, w.obs_len)


def policy_model(cfg: TrainConfig, preset: str | None = None) -> tuple[ModelConfig, str]:
    """sft.model, with the predictor's own layers the run adds."""
    return dataclasses.replace(cfg.sft.model, predictor_layers=cfg.predictor_layers), "sft.model"


FAMILY = Family(name="hopworld", setup=HopWorldTask, turn_shape=turn_shape, policy_model=policy_model,
                description="the synthetic multi-hop search world (JAX environment, CPU-sized)",
                success_metric="eval/success", policy_dir="policy", plot_keys=PLOT_KEYS)
