"""The training loop: data, base policy, equal-cost budgets, steps, evaluation, checkpoints, logs."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from flax import nnx
from tqdm.auto import tqdm

from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.checkpoints import load_model, save_model
from trace_jax.config import TrainConfig, to_dict
from trace_jax.data.hopworld_tfds import build_dataset
from trace_jax.data.loader import hopworld_loader
from trace_jax.envs.hopworld import build_world, protocol
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.evaluate import hop_success
from trace_jax.metrics import MetricsLogger, plot_metrics, read_metrics
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool
from trace_jax.sft import run_sft, split_questions
from trace_jax.train.checkpoint import RunCheckpoints, abstract_state, check_resume_config, newest_meta
from trace_jax.train.step import StepSpec, TrainState, build_step, make_optimizer

PLOT_KEYS = ("reward", "effective_ratio", "eval/success", "eval/success_hop1", "eval/success_hop4", "predictor_loss",
             "root_brier", "prefix_brier", "root_auc", "prefix_auc", "pool_v_std", "generated_tokens", "entropy",
             "utilisation", "prompts", "stage2_unplaced")


def base_policy(cfg: TrainConfig) -> Policy:
    """The SFT policy RL starts from, trained first (with cfg.sft settings) if it does not exist yet."""
    path = Path(cfg.init_checkpoint)
    if not path.exists():
        print(f"train: no base policy at {path}; training it now (trace-jax sft)")
        run_sft(dataclasses.replace(cfg.sft, world=cfg.world, data_dir=cfg.data_dir, out_dir=str(path.parent)))
    return load_model(path)


def pool_of(batch: dict[str, np.ndarray]) -> Pool:
    return Pool(tokens=jnp.asarray(batch["prompt_ids"]), lengths=jnp.asarray(batch["prompt_len"]),
                question=jnp.asarray(batch["question_id"]))


def step_spec(cfg: TrainConfig, roots: int, continuations: int) -> StepSpec:
    allocator = Allocator(cfg.allocator, group_size=cfg.group_size, max_per_anchor=cfg.max_per_anchor or None)
    return StepSpec(plan=Plan(allocator, roots=roots, continuations=continuations),
                    sampling=SamplingConfig(cfg.temperature, cfg.top_p), clip_eps=cfg.clip_eps,
                    kl_coef=cfg.kl_coef, predictor_coef=cfg.predictor_coef, pad_id=protocol.PAD)


def equal_cost_budget(cfg: TrainConfig, graphdef, state: TrainState, env: HopWorldEnv, pool: Pool,
                      tx) -> tuple[int, int]:
    """(M, N) for this run. Tree allocators use the configured budgets. Prefix-free allocators
    (grpo, pcl) get N = 0 and a larger M so their cost matches a tree run's: the same number of
    leaves ("leaves"), or the same generated tokens ("tokens") as one expansion of the
    `cost_reference` allocator with the base policy (continuations start mid-episode, so they are
    cheaper than roots)."""
    alloc = Allocator(cfg.allocator, group_size=cfg.group_size)
    m, n, g = cfg.roots, cfg.continuations, cfg.group_size
    if alloc.uses_prefixes or cfg.equal_cost == "none" or n == 0:
        return m, (n if alloc.uses_prefixes else 0)
    if cfg.equal_cost == "leaves":
        return m * (1 + n), 0
    probe = dataclasses.replace(cfg, allocator=cfg.cost_reference)
    _, metrics = build_step(graphdef, tx, step_spec(probe, m, n))(
        jax.tree.map(jnp.copy, state), env, pool, jax.random.key(cfg.seed + 1))
    total, per_root = int(metrics["generated_tokens"]), int(metrics["root_generated_tokens"]) / m
    roots = max(g, int(round(total / max(per_root, 1e-9) / g)) * g)
    print(f"train: equal cost: a {cfg.cost_reference} {m}x{n} tree generates {total} tokens ({per_root:.1f} "
          f"per root rollout); {cfg.allocator} gets M={roots} root rollouts")
    return roots, 0


def evaluate(model: Policy, env: HopWorldEnv, questions: np.ndarray, cfg: TrainConfig, step: int) -> dict[str, float]:
    out = hop_success(model, env, np.repeat(questions, cfg.eval_samples), cfg.eval_batch,
                      jax.random.fold_in(jax.random.key(cfg.seed + 7), step),
                      SamplingConfig(cfg.temperature, cfg.top_p))
    return {f"eval/{k}": v for k, v in out.items()}


def train(cfg: TrainConfig, resume: bool = False, allow_config_change: bool = False) -> dict[str, float]:
    """Run RL; returns the last step's metrics. Everything lands under cfg.out_dir.

    resume: continue from the newest checkpoint; fails first thing if there is none, or if `cfg` differs from the
    config it was saved with beyond `checkpoint.RESUMABLE_CHANGES` (unless `allow_config_change`).
    """
    out = Path(cfg.out_dir)
    if resume:  # before any work or write: there is a run to continue, and it is this one
        checked, meta = newest_meta(out / "checkpoints")
        check_resume_config(cfg, checked, meta["config"], allow_config_change)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    env = HopWorldEnv(build_world(cfg.world), cfg.world)
    build_dataset(cfg.data_dir, cfg.world)
    loader = hopworld_loader(cfg.data_dir, cfg.world, "train", cfg.pool_size, cfg.seed)
    test_questions = split_questions(dataclasses.replace(cfg.sft, world=cfg.world, data_dir=cfg.data_dir), "test")

    mesh = shd.make_mesh(cfg.mesh)
    model = base_policy(cfg)
    graphdef, params = nnx.split(model)
    params = jax.device_put(params, shd.param_shardings(params, mesh))
    tx = make_optimizer(cfg.learning_rate, cfg.max_grad_norm)
    state = jax.jit(lambda p: TrainState(  # built under jit: every leaf lands on the params' devices
        params=p, opt_state=tx.init(p), ref_params=jax.tree.map(jnp.copy, p) if cfg.kl_coef > 0 else None,
        step=jnp.zeros((), jnp.int32)))(params)
    ckpts = RunCheckpoints(out / "checkpoints", cfg.keep_checkpoints)
    start = 0
    if resume:
        start, state, meta = ckpts.restore_latest(abstract_state(state))
        if start != checked:  # fell back past a corrupt checkpoint: check the config that one was saved with
            check_resume_config(cfg, start, meta["config"], allow_config_change)
        roots, continuations = meta["roots"], meta["continuations"]
        print(f"train: resumed from step {start} ({ckpts.directory})")
    else:
        roots, continuations = equal_cost_budget(cfg, graphdef, state, env, pool_of(loader.batch(0)), tx)
    spec = step_spec(cfg, roots, continuations)
    step_fn = build_step(graphdef, tx, spec)
    key = jax.random.key(cfg.seed)
    last: dict[str, float] = {}
    print(f"train: {cfg.allocator}, pool B={cfg.pool_size}, roots M={roots}, continuations N={continuations} "
          f"({roots * (1 + continuations)} slots), {cfg.steps} steps, mesh {dict(mesh.shape)}")
    with MetricsLogger(out, resume_from_step=start if resume else None) as log:
        if start == 0:
            log.log(0, evaluate(nnx.merge(graphdef, state.params), env, test_questions, cfg, 0))
        bar = tqdm(range(start + 1, cfg.steps + 1), desc=f"train {cfg.allocator}", initial=start, total=cfg.steps)
        for step in bar:
            t0 = time.perf_counter()
            state, metrics = step_fn(state, env, pool_of(loader.batch(step - 1)), jax.random.fold_in(key, step))
            last = {k: float(v) for k, v in jax.device_get(metrics).items()}
            last["step_seconds"] = time.perf_counter() - t0
            if last["skipped"]:
                tqdm.write(f"train: step {step}: non-finite loss or gradient ({last['loss']}); update skipped")
            if step % cfg.eval_every == 0 or step == cfg.steps:
                last.update(evaluate(nnx.merge(graphdef, state.params), env, test_questions, cfg, step))
            log.log(step, last)
            bar.set_postfix(reward=f"{last['reward']:.2f}", eff=f"{last['effective_ratio']:.2f}")
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                ckpts.save(step, state, {"step": step, "roots": roots, "continuations": continuations,
                                         "loader": {"seed": cfg.seed, "step": step}, "config": to_dict(cfg)})
    ckpts.close()
    policy_dir = out / "policy"  # the trained policy alone: `trace-jax export`, `data show --checkpoint`
    save_model(policy_dir, cfg.steps, nnx.merge(graphdef, state.params))
    logged = {k for row in read_metrics(out) for k in row}
    plot = plot_metrics(out, keys=[k for k in PLOT_KEYS if k in logged])
    print(f"train: metrics {out / 'metrics.jsonl'} and {out / 'tensorboard'}, plot {plot}, "
          f"checkpoints {ckpts.directory}, policy {policy_dir}")
    return last
