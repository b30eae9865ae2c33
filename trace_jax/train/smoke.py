"""`trace-jax train --smoke`: a config's first steps at its real shapes on random weights, to check a slice before the
real run: the inputs staged, the step compiled and within device memory, its speed, the logs and a checkpoint round
trip on the run's own storage. Predictor warm-up and evaluations are off. It writes only under <out_dir>/smoke
(with checkpoint_dir set, its checkpoints go beside the run's: <checkpoint_dir>-smoke), so the real run never
resumes from its checkpoints."""

from __future__ import annotations

import dataclasses
import shutil
import time

import jax
import jax.numpy as jnp
import yaml
from etils import epath

from trace_jax import distributed
from trace_jax import sharding as shd
from trace_jax.checkpoints import checkpoint_path
from trace_jax.config import TrainConfig, to_dict
from trace_jax.envs.registry import check_family
from trace_jax.memory.plan import GiB, check_fits, model_of
from trace_jax.metrics import MetricsLogger
from trace_jax.train.checkpoint import abstract_state, run_checkpoints_dir
from trace_jax.train.loop import checkpoint_meta, placed, probed_budget, record_step, run_state, step_spec
from trace_jax.train.run_dir import RunDir, check_storage
from trace_jax.train.step import TrainState
from trace_jax.train.steps import make_step

SMOKE_DIR = "smoke"  # under out_dir


def smoke_config(cfg: TrainConfig, steps: int) -> TrainConfig:
    """cfg cut to a smoke run: `steps` steps, no warm-up, one checkpoint at its end, in out_dir/smoke (its
    checkpoints there too, or with checkpoint_dir set in <checkpoint_dir>-smoke on the same storage)."""
    checkpoints = ""
    if cfg.checkpoint_dir:
        path = checkpoint_path(cfg.checkpoint_dir)
        checkpoints = str(path.parent / f"{path.name}-smoke")
    return dataclasses.replace(cfg, steps=steps, checkpoint_every=steps, keep_checkpoints=1,
                               warmup=dataclasses.replace(cfg.warmup, batches=0),
                               out_dir=str(epath.Path(cfg.out_dir) / SMOKE_DIR), checkpoint_dir=checkpoints)


def device_memory() -> str:
    """The memory in use, its peak and the limit of the fullest of this process's devices, where the backend
    reports them (not on CPU)."""
    stats = [d.memory_stats() or {} for d in jax.local_devices()]
    if not all("bytes_in_use" in s for s in stats):
        return "device memory not reported"
    s = max(stats, key=lambda s: s.get("peak_bytes_in_use", s["bytes_in_use"]))
    return (f"device memory {s['bytes_in_use'] / GiB:.1f} GiB in use, peak "
            f"{s.get('peak_bytes_in_use', s['bytes_in_use']) / GiB:.1f} of {s.get('bytes_limit', 0) / GiB:.1f} GiB")


def _same(a: TrainState, b: TrainState) -> bool:
    """Every array of `a` equals `b`'s, bit for bit."""
    equal = jax.jit(lambda a, b: jnp.stack([jnp.array_equal(x, y) for x, y in zip(jax.tree.leaves(a),
                                                                                    jax.tree.leaves(b))]).all())
    return bool(equal(a, b))


def _clear(run: RunDir, checkpoints: epath.Path) -> None:
    """Removes a previous smoke run's files and checkpoints (the smoke directories alone)."""
    for path in (run.remote, checkpoints):
        if path is not None and path.exists():
            path.rmtree()
    shutil.rmtree(run.local, ignore_errors=True)


def smoke(cfg: TrainConfig, steps: int = 3, preset: str | None = None) -> bool:
    """Runs `steps` steps of cfg as the module docstring says, printing each step's time, generated tokens per
    second and device memory, then a one-line verdict; True when it passed. preset: PRESETS dims for a policy whose
    config.json is not there yet (`trace-jax plan-memory --preset`). Fails first naming what to stage."""
    check_storage(cfg.out_dir, cfg.checkpoint_dir)
    family = check_family(cfg)
    dims, source = model_of(cfg, preset)
    missing = family.missing_inputs(cfg) if family.missing_inputs else []
    if missing:
        raise FileNotFoundError("--smoke: stage these first:\n  " + "\n  ".join(missing))
    scfg = smoke_config(cfg, steps)
    run, main = RunDir.of(scfg.out_dir), distributed.is_main()
    distributed.main_first("smoke: clear", lambda: main and _clear(run, run_checkpoints_dir(scfg)))
    if main:
        run.local.mkdir(parents=True)
        (run.local / "config.yaml").write_text(yaml.safe_dump(to_dict(scfg), sort_keys=False))
        run.push()  # the storage takes a write before any compile
    task = family.setup(scfg)
    mesh = shd.make_mesh(cfg.mesh)
    check_fits(scfg, mesh, preset=preset)
    graphdef, params = placed(shd.init_policy(dims, cfg.seed, mesh), mesh)
    tx, state, ckpts, _, _ = run_state(scfg, params, None)
    budget = probed_budget(scfg, task, graphdef, tx, state, mesh)
    step_fn = make_step(graphdef, tx, step_spec(scfg, budget, task.pad_id, mesh), scfg.chunk_slots, task.host)
    print(f"smoke: {family.name} at the config's shapes on random weights ({source}), pool B={cfg.pool_size}, "
          f"roots M={budget.roots}, continuations N={budget.continuations}, mesh {dict(mesh.shape)}, {steps} steps "
          f"into {scfg.out_dir}")
    key, seconds, tokens, skipped = jax.random.key(cfg.seed), [], [], 0
    with MetricsLogger(run.local, active=main) as log:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            state, metrics = step_fn(state, task.env, task.pool(step, mesh), jax.random.fold_in(key, step))
            last = record_step(log, step, metrics)  # waits for the step
            seconds.append(time.perf_counter() - t0)
            tokens.append(last["generated_tokens"])
            skipped += bool(last["skipped"])
            log.log(step, {**last, "step_seconds": seconds[-1]})
            if main:
                run.push()  # a storage that fails fails the check
            print(f"smoke: step {step}/{steps}: {seconds[-1]:.1f} s{' (compiling)' if step == 1 else ''}, "
                  f"{tokens[-1] / seconds[-1]:,.0f} generated tokens/s, reward {last['reward']:.3f}, loss "
                  f"{last['loss']:.4g}, {device_memory()}")
    ckpts.save(steps, state, checkpoint_meta(scfg, steps, budget))
    restored_step, restored, _ = ckpts.restore_latest(abstract_state(state))
    ckpts.close()
    problems = [f"{skipped} of {steps} updates skipped (non-finite loss or gradient)"] if skipped else []
    if restored_step != steps or not _same(state, restored):
        problems.append(f"the checkpoint restored from {ckpts.directory} is not the state saved at step {steps}")
    timed = slice(1, None) if steps > 1 else slice(None)
    speed = (f"{sum(seconds[timed]) / len(seconds[timed]):.1f} s a step after the first ({seconds[0]:.1f} s with "
             "compiling)" if steps > 1 else f"{seconds[0]:.1f} s for its one step, compiling included")
    print(f"smoke: {'FAILED: ' + '; '.join(problems) if problems else 'OK'}: {speed}, "
          f"{sum(tokens[timed]) / sum(seconds[timed]):,.0f} generated tokens/s, {device_memory()}; checkpoint "
          f"saved to and restored from {ckpts.directory}")
    return not problems
