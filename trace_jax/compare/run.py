"""Runs a comparison: one predictor warm-up per seed shared by every method, then each method per seed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml
from flax import nnx

from trace_jax import sharding as shd
from trace_jax.checkpoints import save_model
from trace_jax.compare.config import CompareConfig
from trace_jax.compare.methods import check_fair, method_config, parse_methods
from trace_jax.compare.plots import plot_comparison
from trace_jax.compare.protocol import write_protocol
from trace_jax.compare.summary import markdown_table, summarize
from trace_jax.config import TrainConfig, WarmupConfig, from_dict, to_dict
from trace_jax.envs.family import Evaluation
from trace_jax.envs.registry import check_family
from trace_jax.train.loop import placed, train, warm_up


def run_dir(out_dir: str | Path, method: str, seed: int) -> Path:
    return Path(out_dir) / "runs" / method / f"seed{seed}"


def finished(out_dir: Path, cfg: TrainConfig, done: str) -> bool:
    """Whether out_dir holds `done` made under `cfg` (its config.yaml); raises if made under another config.
    Keys the saved config lacks (added to TrainConfig since) count as their defaults."""
    if not (out_dir / done).exists():
        return False
    saved = from_dict(TrainConfig, yaml.safe_load((out_dir / "config.yaml").read_text()))
    if saved != cfg:
        raise ValueError(f"{out_dir} holds a finished run of another configuration; pick a new out_dir for this "
                         "comparison or delete that folder")
    return True


def run_checkpoint_dir(checkpoint_dir: str, method: str, seed: int) -> str:
    """A run's own checkpoint folder under the comparison's train.checkpoint_dir ("": the run's out_dir's)."""
    return f"{checkpoint_dir.rstrip('/')}/{method}/seed{seed}" if checkpoint_dir else ""


def shared_start(cfg: TrainConfig, out_dir: Path) -> tuple[Path, Evaluation]:
    """The family's base policy with its head warmed up under `cfg` (seed included), saved once in out_dir, and its
    step-0 evaluation (every method starts from it with the same evaluation keys): (checkpoint, evaluation)."""
    path = out_dir / "checkpoints"
    if not finished(out_dir, cfg, "step0_eval.json"):
        task = check_family(cfg).setup(cfg)
        mesh = shd.make_mesh(cfg.mesh)
        model = task.base_policy(mesh)
        report = warm_up(cfg, model, task.env, lambda i: task.warmup_pool(i, mesh), task.pad_id, host=task.host)
        save_model(path, 0, model)
        (out_dir / "warmup.json").write_text(json.dumps(report, indent=1))
        (out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        model = nnx.merge(*placed(model, mesh))  # evaluated as `train` would, with its program
        (out_dir / "step0_eval.json").write_text(json.dumps(task.evaluate(model, 0, mesh).as_json()))  # last: done
    return path, Evaluation.from_json(json.loads((out_dir / "step0_eval.json").read_text()))


def compare(ccfg: CompareConfig) -> dict:
    """Writes PROTOCOL.md (unless there), trains every method x seed into ccfg.out_dir/runs/<method>/seed<s>, then
    writes summary.json, results.md and the PNGs there from the runs' raw metrics. Finished runs are reused."""
    out = Path(ccfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.yaml").write_text(yaml.safe_dump(to_dict(ccfg), sort_keys=False))
    write_protocol(ccfg, out)  # before any run; kept as written when the comparison goes on
    methods = parse_methods(ccfg.methods)
    seeds = [ccfg.train.seed + k for k in range(ccfg.seeds)]
    family = check_family(ccfg.train)
    for seed in seeds:
        base = dataclasses.replace(ccfg.train, seed=seed)
        init, step0 = shared_start(base, out / "warmup" / f"seed{seed}")
        configs = {m: method_config(base, m, out_dir=str(run_dir(out, m, seed)), init_checkpoint=str(init),
                                    checkpoint_dir=run_checkpoint_dir(base.checkpoint_dir, m, seed),
                                    warmup=WarmupConfig(batches=0)) for m in methods}
        check_fair(configs)
        for m, cfg in configs.items():
            if finished(Path(cfg.out_dir), cfg, family.policy_dir):
                print(f"compare: {m} seed {seed} already finished in {cfg.out_dir}; reusing it")
                continue
            print(f"compare: {m}, seed {seed}")
            train(cfg, step0_eval=step0, start=init)  # a run stopped midway (preempted) continues by itself
    summary = summarize(out, methods, seeds, family.success_metric)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "results.md").write_text(markdown_table(summary))
    plots = plot_comparison(out, methods, seeds, summary)
    print(markdown_table(summary))
    print(f"compare: results in {out}: summary.json, results.md, {', '.join(p.name for p in plots)}")
    return summary
