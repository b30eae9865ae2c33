"""The compiled TRACE step and the training loop: one compilation, sharding, NaN skips, exact resume."""

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from built_once import built_once, session_tmp
from flax import nnx
from processes import kill_once_saved

from toy import TINY_POLICY as TINY
from trace_jax import sharding as shd
from trace_jax.checkpoints import load_model, save_model
from trace_jax.cli import main
from trace_jax.config import MeshConfig, TrainConfig, load_config
from trace_jax.data.hopworld_tfds import build_dataset
from trace_jax.data.loader import hopworld_loader
from trace_jax.envs.hopworld import build_world, protocol
from trace_jax.envs.hopworld import family as hopworld
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.rollout.engine import TurnSpec, max_len
from trace_jax.train import loop
from trace_jax.train.checkpoint import check_resume_config, newest_meta
from trace_jax.train.loop import Budget, refill_rows, step_spec, train
from trace_jax.train.step import TrainState, apply_update, build_step, make_optimizer
from trace_jax.train.steps import make_step

pytestmark = pytest.mark.all_devices  # runs on the 8 host devices' mesh: sharded steps, checkpoints and resume

# Sampling, KL and clipping off their defaults (which the compare and notebook runs keep): the runs below check that
# a resumed, preempted or multi-process run equals the uninterrupted one on these paths too.
OVERRIDES = ["world.num_entities=64", "world.num_questions=120", "pool_size=4", "roots=4", "continuations=1",
             "group_size=2", "eval_batch=16", "eval_every=100", "learning_rate=0.01", "warmup.batches=2",
             "warmup.fit_steps=50", "eval_samples=1", "temperature=0.8", "top_p=0.9", "kl_coef=0.05",
             "max_grad_norm=0.5"]
FULL_STEPS = ["steps=5", "checkpoint_every=1"]


def _base_and_data(root: Path) -> None:
    save_model(root / "base", 0, shd.init_policy(TINY, seed=0))
    build_dataset(root / "tfds", config(root).world)


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    """A folder with the base policy (base/) and the dataset (tfds/); tests add their runs under their own names."""
    return built_once(session_tmp(tmp_path_factory), "train", _base_and_data)


def no_plots(mp: pytest.MonkeyPatch) -> None:
    """Skips a run's PNGs (matplotlib's seconds at each evaluation and at the end), for runs whose checks read its
    metrics and checkpoints only: the runs' plots are drawn in tests/test_compare.py (a fresh and a resumed run)
    and in the notebooks."""
    mp.setattr(loop, "plot_metrics", lambda out, keys: Path(out) / "metrics.png")
    mp.setattr(loop, "plot_reliability", lambda panels, path: Path(path))


def _full_run(root: Path, out: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        no_plots(mp)
        train(config(root, *FULL_STEPS, f"out_dir={out}"))


@pytest.fixture(scope="module")
def full_run(run_dirs, tmp_path_factory) -> Path:
    """A finished 5-step run with a checkpoint every step (the newest 3 kept)."""
    return built_once(session_tmp(tmp_path_factory), "train_full", lambda out: _full_run(run_dirs, out))


def config(root: Path, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, None, OVERRIDES + [f"init_checkpoint={root / 'base'}",
                                                     f"data_dir={root / 'tfds'}", *extra])


def setup_step(cfg: TrainConfig, mesh=None):
    model = shd.init_policy(TINY, seed=0, mesh=mesh)
    graphdef, params = nnx.split(model)
    tx = make_optimizer(cfg.learning_rate, cfg.max_grad_norm, cfg.head_learning_rate)
    state = loop.initial_state(cfg, params, tx)  # with the KL term's frozen reference
    env = HopWorldEnv(build_world(cfg.world), cfg.world)
    build_dataset(cfg.data_dir, cfg.world)
    loader = hopworld_loader(cfg.data_dir, cfg.world, "train", cfg.pool_size, cfg.seed)
    spec = step_spec(cfg, Budget(cfg.roots, cfg.continuations, cfg.group_size), protocol.PAD, mesh)
    return build_step(graphdef, tx, spec), state, env, loader


def test_multi_step_run_compiles_once(run_dirs):
    cfg = config(run_dirs)
    step_fn, state, env, loader = setup_step(cfg)
    for step in range(3):
        state, metrics = step_fn(state, env, hopworld.pool_of(loader.batch(step)), jax.random.key(step))
    assert step_fn._cache_size() == 1
    assert int(state.step) == 3
    assert metrics["leaves"] > 0 and np.isfinite(float(metrics["loss"]))


def test_sharded_step_matches_single_device(run_dirs):
    # no KL term: at the first step the policy is its reference, so the KL's gradient is float rounding, different
    # on one device and on a mesh, and Adam's first update turns it into steps of up to ~0.01 x lr on parameters
    # the policy loss leaves at 0 (unused token embeddings): 9e-5 apart with kl_coef=0.05, 7e-9 without
    cfg = config(run_dirs, "kl_coef=0")
    step_fn, state, env, loader = setup_step(cfg)
    mesh = shd.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    step_sh, state_sh, _, _ = setup_step(cfg, mesh=mesh)
    # the default refill_slots: one device rolls out the 8 slots on 4 refilled rows, the mesh's 4 data-parallel
    # devices synchronously (16 rows >= 8 slots): this also checks the refilled step against the synchronous one
    assert refill_rows(cfg) == 4 and refill_rows(cfg, mesh) == 16
    assert len(jax.tree.leaves(state_sh.params)[0].sharding.device_set) > 1
    pool = hopworld.pool_of(loader.batch(0))
    new, metrics = step_fn(state, env, pool, jax.random.key(0))
    new_sh, metrics_sh = step_sh(state_sh, env, pool, jax.random.key(0))
    for key in ("reward", "loss", "predictor_loss", "generated_tokens", "effective_ratio"):
        np.testing.assert_allclose(metrics[key], metrics_sh[key], rtol=1e-4, atol=1e-5, err_msg=key)
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(new_sh.params)):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # data parallel over (data, fsdp): no device computes the logits [rows, L, V] of all 8 slots in the update
    hlo = step_sh.lower(state_sh, env, pool, jax.random.key(0)).compile().as_text()
    length = max_len(pool.tokens.shape[1], TurnSpec.of(env))
    logits = re.findall(rf"f32\[(\d+),(\d+),{TINY.vocab_size}\]", hlo)
    rows = {int(r) for r, n in logits if int(n) in (length - 1, length)}
    assert 8 // 4 in rows and 8 not in rows, rows


def test_non_finite_loss_skips_the_update():
    params = {"w": jnp.ones(3)}
    tx = make_optimizer(0.1, 1.0)
    state = TrainState(params=params, opt_state=tx.init(params), ref_params=None, step=jnp.zeros((), jnp.int32))
    same, skipped = apply_update(tx, state, {"w": jnp.array([1.0, jnp.nan, 0.0])}, jnp.float32(1.0))
    assert bool(skipped) and int(same.step) == 1
    for a, b in zip(jax.tree.leaves((state.params, state.opt_state)), jax.tree.leaves((same.params, same.opt_state))):
        np.testing.assert_array_equal(a, b)
    moved, skipped = apply_update(tx, state, {"w": jnp.ones(3)}, jnp.float32(1.0))
    assert not bool(skipped) and (np.asarray(moved.params["w"]) < 1).all()


def test_bad_train_config_fails_before_work():
    with pytest.raises(ValueError, match="allocator='treee'"):
        load_config(TrainConfig, None, ["allocator=treee"])
    with pytest.raises(ValueError, match="unknown config key 'rootz'"):
        load_config(TrainConfig, None, ["rootz=4"])
    with pytest.raises(ValueError, match="group_size=3 must divide"):
        load_config(TrainConfig, None, ["group_size=3"])


def _metrics(out: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k != "step_seconds"} for r in rows}


def test_sigkill_then_resume_reproduces_the_uninterrupted_run(run_dirs, full_run, monkeypatch):
    steps = FULL_STEPS
    killed = run_dirs / "killed"
    cmd = [sys.executable, "-m", "trace_jax.cli", "train", *OVERRIDES, *steps, f"out_dir={killed}",
           f"init_checkpoint={run_dirs / 'base'}", f"data_dir={run_dirs / 'tfds'}"]
    kill_once_saved(cmd, killed / "checkpoints" / "2" / "meta")
    done = max(int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit())
    assert done < 5, "the run finished before it could be killed"

    # The newest checkpoint is corrupt: resume says so and falls back to the previous one.
    newest = killed / "checkpoints" / str(done)
    shutil.rmtree(newest / "state")
    resumed = config(run_dirs, *steps, f"out_dir={killed}")
    no_plots(monkeypatch)
    live = {}  # what on_log (a notebook's live plots) saw: each row as written
    train(resumed, on_log=lambda step, row: live.setdefault(step, dict(row)))  # the same run: it continues
    assert load_model(killed / "policy").cfg == TINY  # the trained policy, ready for export
    a, b = _metrics(full_run), _metrics(killed)
    assert sorted(b) == sorted(a) == list(range(6))
    assert sorted(live) == list(range(done, 6))  # resumed from step done - 1
    written = lambda row: {k: v if math.isfinite(v) else None for k, v in row.items()}  # NaN: null in the file
    assert all({"step": step, **written(live[step])} == (b[step] | {"step_seconds": live[step]["step_seconds"]})
               for step in live)
    for step in range(done - 1, 6):
        assert a[step] == b[step], f"step {step} differs after resume"


def test_sigterm_saves_the_step_and_exits_then_resume_reproduces_the_uninterrupted_run(run_dirs, full_run, tmp_path,
                                                                                       capsys, monkeypatch):
    """A preemption: SIGTERM mid-run (in this process, from a watcher thread once step 2 is saved). The step in
    flight finishes, is logged and checkpointed, and the command exits with 143; the same command again, without
    --resume (a restarted pod), continues it and reproduces the uninterrupted run exactly."""
    run = tmp_path / "preempted"
    args = ["train", *OVERRIDES, *FULL_STEPS, f"out_dir={run}", f"init_checkpoint={run_dirs / 'base'}",
            f"data_dir={run_dirs / 'tfds'}"]

    def preempt():
        deadline = time.time() + 300
        while not (run / "checkpoints" / "2" / "meta").exists() and time.time() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    no_plots(monkeypatch)
    watcher = threading.Thread(target=preempt, daemon=True)
    watcher.start()
    assert main(args) == 128 + signal.SIGTERM
    watcher.join()
    err = capsys.readouterr().err
    stopped = int(re.search(r"preempted \(SIGTERM\) after step (\d+)", err).group(1))
    assert 2 <= stopped < 5 and "The same command continues it" in err
    assert newest_meta(run / "checkpoints")[0] == stopped and not (run / "policy").exists()
    assert sorted(_metrics(run)) == list(range(stopped + 1))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler was the run's alone
    assert main(args) == 0
    assert f"holds this run's checkpoint at step {stopped}" in capsys.readouterr().out
    assert _metrics(run) == _metrics(full_run)


def test_resume_with_nothing_to_resume_fails_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a fresh directory: default data_dir and init_checkpoint do not exist here
    (tmp_path / "empty").mkdir()
    assert main(["train", "--resume", "out_dir=empty"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint under" in err and str(Path("empty", "checkpoints")) in err and "without --resume" in err
    assert [p.name for p in tmp_path.rglob("*")] == ["empty"]  # no config.yaml, dataset or base policy
    assert main(["train", "--allow-config-change", "out_dir=empty"]) == 2
    assert "only applies with --resume" in capsys.readouterr().err


def test_a_missing_base_policy_is_built_only_where_it_can_be_loaded(tmp_path, monkeypatch):
    """SFT saves into <its out_dir>/checkpoints, so a missing init_checkpoint not named so would be built beside
    it and then not found; it is refused before any SFT step, naming the path to set."""
    monkeypatch.setattr(hopworld, "run_sft", lambda cfg: pytest.fail("SFT ran"))
    with pytest.raises(FileNotFoundError, match=f"set init_checkpoint={tmp_path / 'my_base' / 'checkpoints'}"):
        hopworld.base_policy(load_config(TrainConfig, None, [f"init_checkpoint={tmp_path / 'my_base'}"]))
    built = []
    monkeypatch.setattr(hopworld, "run_sft", lambda cfg: built.append(cfg.out_dir) or save_model(
        Path(cfg.out_dir, "checkpoints"), 0, shd.init_policy(TINY, seed=0)))
    hopworld.base_policy(load_config(TrainConfig, None, [f"init_checkpoint={tmp_path / 'my_base' / 'checkpoints'}"]))
    assert built == [str(tmp_path / "my_base")]


def test_resume_refuses_a_changed_config_unless_allowed(full_run, run_dirs, tmp_path, capsys, monkeypatch):
    run = tmp_path / "moved"
    shutil.copytree(full_run, run)  # a moved run: out_dir differs, which resume accepts
    paths = [f"out_dir={run}", f"init_checkpoint={run_dirs / 'base'}", f"data_dir={run_dirs / 'tfds'}"]
    args = ["train", "--resume", *OVERRIDES, *FULL_STEPS, *paths]
    saved = (run / "config.yaml").read_text()
    capsys.readouterr()

    assert main([*args, "learning_rate=0.02", "sft.steps=30", "eval_every=2"]) == 2
    err = capsys.readouterr().err
    assert "learning_rate: 0.01 -> 0.02" in err and "sft.steps: 300 -> 30" in err and "--allow-config-change" in err
    assert "out_dir" not in err and "eval_every" not in err  # allowed changes are not refused
    assert (run / "config.yaml").read_text() == saved  # the run's config is not overwritten
    assert main([*args, "steps=4"]) == 2 and "steps=4 is below the checkpoint's step 5" in capsys.readouterr().err
    new_run = [a for a in args if a != "--resume"]  # a new run into this one's directory, before any work
    assert main([*new_run, "learning_rate=0.02"]) == 2
    err = capsys.readouterr().err
    assert "holds another run's checkpoints (newest: step 5)" in err and "learning_rate: 0.01 -> 0.02" in err
    assert "set out_dir" in err and (run / "config.yaml").read_text() == saved

    # Extending the run (and the other allowed changes) needs no flag; checked without paying for a training step.
    step, meta = newest_meta(run / "checkpoints")
    extended = config(run_dirs, *FULL_STEPS, *paths, "steps=8", "eval_every=2", "checkpoint_every=3",
                      "keep_checkpoints=1", "mesh.fsdp=2", f"data_dir={tmp_path / 'tfds'}")
    check_resume_config(extended, step, meta["config"], allow_change=False)
    assert "steps: 5 -> 8" in capsys.readouterr().out
    # the budget is the checkpoint's: a resume that changes what sets it is refused even with the flag
    rebudgeted = config(run_dirs, *FULL_STEPS, *paths, "roots=8", "allocator=grpo")
    with pytest.raises(ValueError, match="start a new run") as refused:
        check_resume_config(rebudgeted, step, meta["config"], allow_change=True)
    assert "roots: 4 -> 8" in str(refused.value) and "allocator: 'trace' -> 'grpo'" in str(refused.value)

    monkeypatch.setattr(loop, "plot_metrics", lambda out, keys: out / "metrics.png")  # seconds of matplotlib
    assert main([*args, "learning_rate=0.02", "--allow-config-change"]) == 0  # steps=5: nothing left to train
    assert "learning_rate: 0.01 -> 0.02" in capsys.readouterr().out
    assert load_config(TrainConfig, run / "config.yaml").learning_rate == 0.02


def test_equal_cost_probes_the_cost_reference_allocator(tmp_path):
    """The probe runs `cost_reference`'s tree at the run's (M, N) and pool, and M follows its tokens per root rollout
    (a probe that records what it is asked: nothing is compiled)."""
    from trace_jax.train.loop import equal_cost_budget

    asked = []

    def probe(spec):
        asked.append((spec.plan.allocator.name, spec.plan.roots, spec.plan.continuations))
        return {"generated_tokens": 600, "root_generated_tokens": 240, "leaves": 12, "prompts": 3}

    for reference in ("trace", "uniform_tree", "random_tree"):
        cfg = config(tmp_path, "allocator=pcl", "roots=4", "continuations=2", "pool_size=8",
                     f"cost_reference={reference}")
        assert equal_cost_budget(cfg, probe, protocol.PAD) == (10, 0, 2)  # 600 tokens at 240 / 4 = 60 a root: 10 roots
        assert asked[-1] == (reference, 4, 2)
        matched = dataclasses.replace(cfg, match_group_size=True)
        assert equal_cost_budget(matched, probe, protocol.PAD) == (8, 0, 4)  # 12 / 3
    with pytest.raises(ValueError, match="cost_reference='grpo' must be a tree allocator"):
        config(tmp_path, "cost_reference=grpo")


def test_equal_cost_budgets_for_prefix_free_allocators(run_dirs):
    from trace_jax.train.loop import equal_cost_budget

    cfg = config(run_dirs, "allocator=grpo", "roots=4", "continuations=2", "pool_size=8")
    _, state, env, loader = setup_step(config(run_dirs))
    graphdef = nnx.graphdef(shd.init_policy(TINY, seed=0))
    tx = make_optimizer(cfg.learning_rate, cfg.max_grad_norm)
    pool = hopworld.pool_of(hopworld_loader(cfg.data_dir, cfg.world, "train", cfg.pool_size, cfg.seed).batch(0))
    # the probes below all run the trace 4x2 reference step: `make_step` builds it once per spec, as `train` does
    probe = lambda spec: make_step(graphdef, tx, spec)(jax.tree.map(jnp.copy, state), env, pool,
                                                       jax.random.key(cfg.seed + 1))[1]
    assert equal_cost_budget(dataclasses.replace(cfg, equal_cost="leaves"), probe, protocol.PAD) == (12, 0, 2)
    unmatched = dataclasses.replace(cfg, equal_cost="none")
    assert equal_cost_budget(unmatched, probe, protocol.PAD) == (4, 0, 2)  # M as configured
    roots, n, g = equal_cost_budget(cfg, probe, protocol.PAD)
    # continuations start mid-episode: matching tokens costs fewer extra roots than matching leaves
    assert n == 0 and g == cfg.group_size and roots % g == 0 and cfg.roots <= roots <= 12
    tree_cfg = config(run_dirs, "allocator=trace", "roots=4", "continuations=2", "pool_size=8")
    assert equal_cost_budget(tree_cfg, probe, protocol.PAD) == (4, 2, 2)
    # the matched-group control: G = the reference tree's leaves per opened prompt (same probe key)
    tree = probe(step_spec(tree_cfg, Budget(4, 2, 2), protocol.PAD))
    roots, n, g = equal_cost_budget(dataclasses.replace(cfg, match_group_size=True), probe, protocol.PAD)
    assert g == round(float(tree["leaves"]) / float(tree["prompts"])) and g != cfg.group_size
    assert n == 0 and roots % g == 0
