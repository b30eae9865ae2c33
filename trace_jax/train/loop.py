"""The training loop of every task family: base policy, predictor warm-up, equal-cost budgets, steps, evaluation,
checkpoints and resume, preemption, logs. The family (`envs.registry`, selected by `env`) brings the data, the
environment, the base policy and the evaluation (`envs.family.Task`); the step is built for its environment's kind
(`train.steps.make_step`)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
import yaml
from flax import nnx
from tqdm.auto import tqdm

from trace_jax import distributed
from trace_jax import sharding as shd
from trace_jax.allocation import Allocator, Plan
from trace_jax.checkpoints import load_model
from trace_jax.config import TrainConfig, to_dict
from trace_jax.envs.base import HostEnv, JaxEnv
from trace_jax.envs.family import Evaluation, Task
from trace_jax.envs.registry import check_family
from trace_jax.memory import check_fits
from trace_jax.metrics import MetricsLogger, plot_metrics, plot_reliability, read_metrics, rewind_jsonl
from trace_jax.models.qwen3 import Policy, with_predictor_layers
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool
from trace_jax.rollout.schedule import expand_scheduled
from trace_jax.train.checkpoint import (
    RunCheckpoints,
    abstract_state,
    check_resume_config,
    resume_point,
    run_checkpoints_dir,
)
from trace_jax.train.preemption import Preempted, sigterm_stops
from trace_jax.train.run_dir import RunDir, check_storage
from trace_jax.train.step import StepSpec, TrainState, make_optimizer
from trace_jax.train.steps import make_step
from trace_jax.train.warmup import WarmupSpec, warm_up_predictor

MEANINGFUL_QUESTIONS = 100  # held-out questions below which the warm-up's AUC interval is too wide to read much
RELIABILITY_FILE = "reliability.jsonl"  # one line per evaluation: {"step", "root": bins, "prefix": bins}
ALLOCATION_FILE = "allocation.jsonl"  # one line per step: the step's ARRAY_METRICS as lists
ARRAY_METRICS = ("pool_v_values", "roots_per_prompt", "continuations_per_anchor")  # see train.step


def placed(model: Policy, mesh: jax.sharding.Mesh) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) of `model`, its params placed on `mesh` as training holds them."""
    graphdef, params = nnx.split(model)
    return graphdef, shd.put_global(params, shd.param_shardings(params, mesh))


class Budget(NamedTuple):
    """A run's per-step budgets: M root rollouts, N continuations per root, G rollouts per chosen prompt."""

    roots: int
    continuations: int
    group_size: int


CPU_REFILL_ROWS = 4  # live rows per data-parallel device of `refill_slots: -1` on CPU (`trace-jax bench sampler`)


def rollout_sampling(cfg: TrainConfig) -> SamplingConfig:
    """How cfg's rollouts sample (temperature, top_p, draw): training, the predictor's warm-up and evaluation alike."""
    return SamplingConfig(cfg.temperature, cfg.top_p, cfg.draw)


def refill_rows(cfg: TrainConfig, mesh: jax.sharding.Mesh | None = None) -> int:
    """S_live of cfg's rollouts (0: synchronous): refill_slots, or for -1 (auto) 4 rows per data-parallel device on
    a CPU (where a decode step costs in proportion to its rows) and 0 elsewhere (unmeasured there), 0 with
    chunk_slots."""
    if cfg.refill_slots >= 0:
        return cfg.refill_slots
    if cfg.chunk_slots or jax.default_backend() != "cpu":
        return 0
    return CPU_REFILL_ROWS * shd.data_parallel_size(mesh)


def pack_rows(cfg: TrainConfig, mesh: jax.sharding.Mesh | None = None) -> int:
    """R of cfg's packed update (0: unpacked): pack_rows, or for -1 (auto) one row per data-parallel device on a
    CPU and 0 elsewhere (unmeasured there)."""
    if cfg.pack_rows >= 0:
        return cfg.pack_rows
    return shd.data_parallel_size(mesh) if jax.default_backend() == "cpu" else 0


def step_spec(cfg: TrainConfig, budget: Budget, pad_id: int,
              mesh: jax.sharding.Mesh | None = None) -> StepSpec:
    """The step of cfg at `budget`; mesh: the slots are split over its data axes."""
    allocator = Allocator(cfg.allocator, group_size=budget.group_size, max_per_anchor=cfg.max_per_anchor or None,
                          max_roots=cfg.max_roots_per_prompt or None)
    return StepSpec(plan=Plan(allocator, roots=budget.roots, continuations=budget.continuations),
                    sampling=rollout_sampling(cfg), clip_eps=cfg.clip_eps,
                    kl_coef=cfg.kl_coef, predictor_coef=cfg.predictor_coef, pad_id=pad_id,
                    predictor_backbone_grad=cfg.predictor_backbone_grad, mesh=mesh, remat=cfg.remat,
                    pack_rows=pack_rows(cfg, mesh), pack_len=cfg.pack_len, pack_block=cfg.pack_block,
                    refill_slots=refill_rows(cfg, mesh))


def initial_state(cfg: TrainConfig, params: nnx.State, tx: optax.GradientTransformation) -> TrainState:
    """The optimizer state and (with a KL term) the frozen reference, built under jit; Adam's moments are sharded
    like the parameters they follow (left to itself, jit replicates them on every device)."""
    placed = all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(params))
    shardings = jax.tree.map(lambda x: x.sharding, params) if placed else None  # None: abstract params (eval_shape)
    masked = lambda x: isinstance(x, optax.MaskedNode)  # the other optimizer group's entries

    def build(p: nnx.State) -> TrainState:
        opt_state = tx.init(p)
        if shardings is not None:
            opt_state = optax.tree_map_params(
                tx, lambda x, s: x if masked(x) else jax.lax.with_sharding_constraint(x, s), opt_state, shardings,
                transform_non_params=lambda x: x, is_leaf=masked)
        return TrainState(params=p, opt_state=opt_state, step=jnp.zeros((), jnp.int32),
                          ref_params=jax.tree.map(jnp.copy, p) if cfg.kl_coef > 0 else None)

    return jax.jit(build)(params)


def run_state(cfg: TrainConfig, params: nnx.State, resume_from: int | None, allow_config_change: bool = False
              ) -> tuple[optax.GradientTransformation, TrainState, RunCheckpoints, int, Budget | None]:
    """(optimizer, state, the run's checkpoints, first step, budget) of a run over `params`: fresh (step 0; budget
    None, for the caller to size), or restored from its newest checkpoint, expected at step resume_from, with the
    budget saved there."""
    tx = make_optimizer(cfg.learning_rate, cfg.max_grad_norm, cfg.head_learning_rate)
    state = initial_state(cfg, params, tx)
    ckpts = RunCheckpoints(run_checkpoints_dir(cfg), cfg.keep_checkpoints)
    if resume_from is None:
        return tx, state, ckpts, 0, None
    start, state, meta = ckpts.restore_latest(abstract_state(state))
    if start != resume_from:  # fell back past a corrupt checkpoint: check the config that one was saved with
        check_resume_config(cfg, start, meta["config"], allow_config_change)
    print(f"train: resumed from step {start} ({ckpts.directory})")
    return tx, state, ckpts, start, Budget(meta["roots"], meta["continuations"], meta["group_size"])


def warm_up(cfg: TrainConfig, model: Policy, env: JaxEnv | HostEnv, pools: Callable[[int], Pool], pad_id: int,
            host: bool = False) -> dict[str, float]:
    """Fits the success predictor of `model` (in place) on uniform trees of the base policy; {} if disabled.
    pools(i): the i-th warm-up pool (`Task.warmup_pool`); host: `env` is a `HostEnv`. The trees are expanded in
    chunks of chunk_slots slots, or on refill_slots rows (`expand_scheduled`)."""
    w = cfg.warmup
    if w.batches == 0:
        return {}
    spec = WarmupSpec(batches=w.batches, group_size=w.group_size, roots=cfg.roots, continuations=cfg.continuations,
                      fit_steps=w.fit_steps, learning_rate=w.learning_rate,
                      sampling=rollout_sampling(cfg), pad_id=pad_id, fit_rows=w.fit_rows,
                      layers_learning_rate=w.layers_learning_rate, held_out=w.held_out)
    expand = functools.partial(expand_scheduled, host=host, chunk_slots=cfg.chunk_slots, live_slots=refill_rows(cfg))
    t0 = time.perf_counter()
    _, report = warm_up_predictor(model, env, pools, jax.random.key(cfg.seed + 3), spec, expand)
    head = f"train: predictor warm-up on {w.batches} uniform-tree pools ({time.perf_counter() - t0:.0f} s), held out: "
    if not report["warmup/root_nodes"]:
        print(head + f"no question (a share of {w.held_out} of the drawn questions is held out: raise warmup.batches "
              "for a report)")
        return report
    r = report
    print(f"{head}root AUC {r['warmup/before/root_auc']:.3f} -> {r['warmup/root_auc']:.3f} (95% interval "
          f"{r['warmup/root_auc_lo']:.2f}-{r['warmup/root_auc_hi']:.2f} over {r['warmup/root_nodes']} prompt nodes of "
          f"{r['warmup/root_questions']} questions), prefix AUC {r['warmup/before/prefix_auc']:.3f} -> "
          f"{r['warmup/prefix_auc']:.3f} ({r['warmup/prefix_auc_lo']:.2f}-{r['warmup/prefix_auc_hi']:.2f} over "
          f"{r['warmup/prefix_nodes']} turn nodes), root ECE {r['warmup/root_ece']:.3f}, prefix ECE "
          f"{r['warmup/prefix_ece']:.3f}, std of prompt V~ {r['warmup/root_v_std']:.3f}")
    if r["warmup/root_questions"] < MEANINGFUL_QUESTIONS:
        print(f"train: the warm-up's report rests on {r['warmup/root_questions']} held-out questions; for a narrower "
              f"interval raise warmup.batches or warmup.held_out (the step-0 evaluation on the test split follows)")
    return report


def checkpoint_step(cfg: TrainConfig, ckpts: RunCheckpoints, step: int, state: TrainState, meta: dict,
                    stop_requested: bool) -> None:
    """After step `step` is logged: checkpoint it every `checkpoint_every` steps and at the end; on a stop request
    (SIGTERM) checkpoint it and raise `Preempted`."""
    stop = stop_requested and step < cfg.steps
    if stop or step % cfg.checkpoint_every == 0 or step == cfg.steps:
        ckpts.save(step, state, meta)
    if stop:
        ckpts.close()
        raise Preempted(cfg.out_dir, step)


def equal_cost_budget(cfg: TrainConfig, probe: Callable[[StepSpec], dict[str, jax.Array]], pad_id: int,
                      mesh: jax.sharding.Mesh | None = None) -> Budget:
    """This run's budgets. Tree allocators use the configured (M, N). Prefix-free allocators (grpo, pcl)
    get N = 0 and a larger M so their cost matches a tree run's: the same number of leaves ("leaves"), or
    the same generated tokens ("tokens") as one expansion of the `cost_reference` allocator by the starting
    policy, whose metrics probe(spec) returns (continuations start mid-episode, so they are cheaper than
    roots). With `match_group_size`, their
    group size G is that expansion's mean leaves per opened prompt (a larger group alone is more often
    mixed, so this control separates TRACE's choice of prompts from its group size). The probe's spec is the
    reference run's own step on `mesh` (the same program, and the same rows refilled)."""
    alloc = Allocator(cfg.allocator, group_size=cfg.group_size)
    m, n, g = cfg.roots, cfg.continuations, cfg.group_size
    if alloc.uses_prefixes:
        return Budget(m, n, g)
    if cfg.equal_cost == "none" or n == 0:
        return Budget(m, 0, g)
    if cfg.equal_cost == "leaves" and not cfg.match_group_size:
        return Budget(m * (1 + n), 0, g)
    metrics = probe(step_spec(dataclasses.replace(cfg, allocator=cfg.cost_reference), Budget(m, n, g), pad_id, mesh))
    total, per_root = int(metrics["generated_tokens"]), int(metrics["root_generated_tokens"]) / m
    if cfg.match_group_size:
        g = min(max(1, round(float(metrics["leaves"]) / max(float(metrics["prompts"]), 1.0))), m * (1 + n))
    rollouts = m * (1 + n) if cfg.equal_cost == "leaves" else total / max(per_root, 1e-9)
    roots = min(max(g, int(round(rollouts / g)) * g), cfg.pool_size * g)
    print(f"train: equal cost: a {cfg.cost_reference} {m}x{n} tree generates {total} tokens ({per_root:.1f} per root "
          f"rollout) over {int(metrics['leaves'])} leaves of {int(metrics['prompts'])} prompts; {cfg.allocator} gets "
          f"M={roots} root rollouts in groups of G={g}")
    return Budget(roots, 0, g)


def probed_budget(cfg: TrainConfig, task: Task, graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                  state: TrainState, mesh: jax.sharding.Mesh) -> Budget:
    """A new run's budget (`equal_cost_budget`), probed with its own step from `state` (left as it is)."""
    return equal_cost_budget(cfg, lambda spec: make_step(graphdef, tx, spec, cfg.chunk_slots, task.host)(
        jax.tree.map(jnp.copy, state), task.env, task.pool(0, mesh), jax.random.key(cfg.seed + 1))[1],
        task.pad_id, mesh)


def checkpoint_meta(cfg: TrainConfig, step: int, budget: Budget) -> dict:
    """What a checkpoint of step `step` keeps beside the state: its budget, data position and config."""
    return {"step": step, **budget._asdict(), "loader": {"seed": cfg.seed, "step": step}, "config": to_dict(cfg)}


def record_step(log: MetricsLogger, step: int, metrics: dict[str, jax.Array],
                said: set[str] | None = None) -> dict[str, float]:
    """A step's metrics as floats; its ARRAY_METRICS go to allocation.jsonl and the pool V~ histogram. Warns
    when the update was skipped, or ran unpacked because the tree did not fit the packing; `said` (a run's, kept
    across its steps) holds the warnings given already, so that the packing's is given once a run."""
    metrics = shd.to_host(metrics)
    spent = {k: metrics.pop(k).tolist() for k in ARRAY_METRICS}
    log.append(ALLOCATION_FILE, {"step": step, **spent})
    log.histogram(step, "pool_v", spent["pool_v_values"])
    last = {k: float(v) for k, v in metrics.items()}
    if last["skipped"]:
        tqdm.write(f"train: step {step}: non-finite loss or gradient ({last['loss']}); update skipped")
    if last.get("pack_overflow") and "pack_overflow" not in (said if said is not None else ()):
        if said is not None:
            said.add("pack_overflow")
        tqdm.write(f"train: step {step}: a prompt's tree did not fit the packing (pack_rows x pack_len); this update "
                   f"ran unpacked (same values, no saving): its trees take {last['pack_needed']:.0f} positions in "
                   "blocks of pack_block; raise pack_len (0: half the unpacked positions; each row holds whole prompt "
                   "trees) or pack_rows. Said once a run: metrics.jsonl's pack_overflow marks every such step")
    return last


def log_evaluation(log: MetricsLogger, out: Path, cfg: TrainConfig, step: int, ev: Evaluation,
                   metrics: dict[str, float]) -> None:
    """Adds ev's eval/* to metrics; appends its records (and reliability bins) to their JSONL files with the step;
    process 0 rewrites its text files and the reliability plot, and prints its report."""
    metrics.update(ev.metrics)
    for name, rows in ev.records.items():
        for row in rows:
            log.append(name, {"step": step, **row})
    if ev.reliability is not None:
        log.append(RELIABILITY_FILE, {"step": step, **ev.reliability})
    if not distributed.is_main():
        return
    for name, text in ev.texts.items():
        (out / name).write_text(text)
        tqdm.write(f"train: step {step} evaluation ({out / name})\n{text}")
    if ev.reliability is not None:
        plot_reliability({f"{name} V~ (test, step {step})": {cfg.allocator: b} for name, b in ev.reliability.items()},
                         out / "reliability.png")


def train(cfg: TrainConfig, resume: bool = False, allow_config_change: bool = False,
          step0_eval: Evaluation | None = None, on_log: Callable[[int, dict[str, float]], None] | None = None,
          start: str | Path | None = None) -> dict[str, float]:
    """Run RL on cfg's task family (`env`); returns the last step's metrics. Everything lands under cfg.out_dir
    (gs://bucket/run: a local working copy mirrored there, `train.run_dir`).

    on_log(step, metrics): called in process 0 with each row written to metrics.jsonl as floats (NaN where it has
    null; step 0: the warm-up and the starting evaluation), e.g. to redraw live plots in a notebook.

    step0_eval: the starting policy's evaluation at step 0, when the caller has it already (a comparison's
    methods share their starting policy and evaluation keys); computed here when None.

    start: an orbax policy checkpoint to start from instead of the family's base policy (a comparison's shared
    start, its predictor already warmed up).

    resume: continue from the newest checkpoint; fails first thing if there is none, or if `cfg` differs from the
    config it was saved with beyond `checkpoint.RESUMABLE_CHANGES` (unless `allow_config_change`). Without it, a
    run whose checkpoint directory holds this run's checkpoints continues them, and one holding another run's
    fails first thing (`checkpoint.resume_point`).
    """
    check_storage(cfg.out_dir, cfg.checkpoint_dir)
    family = check_family(cfg)
    run = RunDir.of(cfg.out_dir)
    out = run.local
    checked = resume_point(cfg, resume, allow_config_change)  # before any work or write
    resume = checked is not None
    main = distributed.is_main()  # the process that writes the run's files (every process checkpoints)
    mesh = shd.make_mesh(cfg.mesh)  # fails naming the devices when the mesh cannot be filled, before any work
    check_fits(cfg, mesh)  # fails naming the bytes and the chunk_slots to set when the step cannot fit the devices
    task: Task = family.setup(cfg)
    env = task.env
    model = with_predictor_layers(load_model(start), cfg.predictor_layers) if start else task.base_policy(mesh)
    if main:  # the run's folder once its data, environment and policy are there: a run that fails sooner leaves none
        run.pull(resume)  # a remote out_dir's logs, which a resumed run continues
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        run.push()
    warmup = {} if resume else warm_up(cfg, model, env, lambda i: task.warmup_pool(i, mesh), task.pad_id,
                                       host=task.host)  # a resumed state already holds the warmed-up head
    graphdef, params = placed(model, mesh)
    tx, state, ckpts, start, budget = run_state(cfg, params, checked if resume else None, allow_config_change)
    if budget is None:
        budget = probed_budget(cfg, task, graphdef, tx, state, mesh)
    spec = step_spec(cfg, budget, task.pad_id, mesh)
    step_fn = make_step(graphdef, tx, spec, cfg.chunk_slots, task.host)
    key = jax.random.key(cfg.seed)
    last: dict[str, float] = {}
    said: set[str] = set()  # the warnings this run gave already (`record_step`)
    roots, continuations = budget.roots, budget.continuations
    print(f"train: {family.name}, {cfg.allocator}, pool B={cfg.pool_size}, roots M={roots}, continuations "
          f"N={continuations}, group G={budget.group_size} ({roots * (1 + continuations)} slots), {cfg.steps} steps, "
          f"mesh {dict(mesh.shape)}")

    def log_eval(step: int, metrics: dict[str, float], done: Evaluation | None = None) -> None:
        ev = done or task.evaluate(nnx.merge(graphdef, state.params), step, mesh)
        log_evaluation(log, out, cfg, step, ev, metrics)

    for name in (RELIABILITY_FILE, ALLOCATION_FILE, *family.records) if main else ():  # a fresh run starts anew
        rewind_jsonl(out / name, start if resume else -1)
    with MetricsLogger(out, resume_from_step=start if resume else None, active=main, on_log=on_log) as log, \
            sigterm_stops() as stop_requested:
        if start == 0:
            first = dict(warmup)
            log_eval(0, first, step0_eval)
            log.log(0, first)
            if main:
                run.push(retry_later=True)
        bar = tqdm(range(start + 1, cfg.steps + 1), desc=f"train {cfg.allocator}", initial=start, total=cfg.steps,
                   disable=not main)
        for step in bar:
            t0 = time.perf_counter()
            state, metrics = step_fn(state, env, task.pool(step, mesh), jax.random.fold_in(key, step))
            last = record_step(log, step, metrics, said)
            last["step_seconds"] = time.perf_counter() - t0
            if step % cfg.eval_every == 0 or step == cfg.steps:
                log_eval(step, last)
            log.log(step, last)
            if main:
                run.push(retry_later=True)
            bar.set_postfix(reward=f"{last['reward']:.2f}", eff=f"{last['effective_ratio']:.2f}")
            checkpoint_step(cfg, ckpts, step, state, checkpoint_meta(cfg, step, budget),
                            distributed.any_process(stop_requested()))
    ckpts.close()
    policy = task.save_policy(nnx.merge(graphdef, state.params), out)  # every process (a sharded save gathers)
    if not main:
        return last
    logged = {k for row in read_metrics(out) for k in row}
    plot = plot_metrics(out, keys=[k for k in family.plot_keys if k in logged])
    run.push()
    print(f"train: metrics {out / 'metrics.jsonl'} and {out / 'tensorboard'}, plot {plot}, "
          f"checkpoints {ckpts.directory}, policy {policy}")
    if run.remote is not None:
        print(f"train: all mirrored to {run.remote}")
    return last
