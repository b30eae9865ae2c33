"""Orbax checkpoints of everything a run needs to continue exactly: state, step, data position, budgets."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from trace_jax.checkpoints import checkpoint_path
from trace_jax.config import TrainConfig, to_dict
from trace_jax.train.step import TrainState

ITEMS = ("state", "meta")
# Config keys (or sections) a resumed run may change without allow_config_change: how long to run, how often to
# evaluate and checkpoint, where the run, its checkpoints and the dataset live, the device layout. None alters the
# algorithm or what the metrics measure. Keep the help of `trace-jax train --resume` in step.
# mesh, chunk_slots, refill_slots, remat and pack_*: memory layout and schedule, the same updates up to rounding.
RESUMABLE_CHANGES = ("steps", "eval_every", "checkpoint_every", "keep_checkpoints", "out_dir", "checkpoint_dir",
                     "data_dir", "mesh", "chunk_slots", "refill_slots", "remat",
                     "pack_rows", "pack_len", "pack_block")
# What sets a run's budget (M, N, G), fixed at its start (`loop.equal_cost_budget`) and restored from the checkpoint:
# a resume cannot change them, even with --allow-config-change.
BUDGET_KEYS = ("allocator", "roots", "continuations", "group_size", "equal_cost", "cost_reference",
               "match_group_size")


def run_checkpoints_dir(cfg: TrainConfig) -> epath.Path:
    """Where cfg's run keeps its orbax checkpoints: cfg.checkpoint_dir, or out_dir/checkpoints (gs:// too)."""
    return checkpoint_path(cfg.checkpoint_dir) if cfg.checkpoint_dir else checkpoint_path(cfg.out_dir) / "checkpoints"


class RunCheckpoints:
    """`out_dir/checkpoints/<step>/{state, meta}`; keeps the newest `keep` steps."""

    def __init__(self, directory: str | os.PathLike, keep: int) -> None:
        self.directory = checkpoint_path(directory)
        self.manager = ocp.CheckpointManager(
            self.directory, item_names=ITEMS,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def save(self, step: int, state: TrainState, meta: dict[str, Any]) -> None:
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def restore_latest(self, abstract: TrainState) -> tuple[int, TrainState, dict[str, Any]]:
        """The newest checkpoint that restores cleanly; a corrupt one is reported and the previous one used."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"--resume: no checkpoint under {self.directory}; start without --resume")
        errors = []
        for step in steps:
            try:
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
            except Exception as e:
                errors.append(f"step {step}: {type(e).__name__}: {e}")
                print(f"resume: checkpoint at step {step} is unreadable ({type(e).__name__}); "
                      "trying the previous one")
                continue
            if errors:
                print(f"resume: fell back to step {step}")
            return step, out["state"], out["meta"]
        raise ValueError(f"--resume: no readable checkpoint under {self.directory}:\n  " + "\n  ".join(errors))

    def close(self) -> None:
        self.manager.close()


def abstract_state(state: TrainState) -> TrainState:
    """Shapes, dtypes and shardings of `state`, as a restore target."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)


def newest_meta(directory: str | os.PathLike) -> tuple[int, dict[str, Any]]:
    """(step, meta) of the newest checkpoint under `directory` whose meta reads, restoring no state and creating
    nothing; FileNotFoundError when there is no checkpoint to resume."""
    directory = checkpoint_path(directory)
    nothing = FileNotFoundError(f"--resume: no checkpoint under {directory}, so nothing to resume; run without "
                                "--resume to start a new run, or set out_dir to the run to continue")
    if not directory.is_dir():
        raise nothing
    with ocp.CheckpointManager(directory, item_names=ITEMS,
                               options=ocp.CheckpointManagerOptions(create=False)) as manager:
        steps = sorted(manager.all_steps(), reverse=True)
        if not steps:
            raise nothing
        errors = []
        for step in steps:
            try:
                return step, manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            except Exception as e:
                errors.append(f"step {step}: {type(e).__name__}: {e}")
    raise ValueError(f"--resume: no readable checkpoint under {directory}:\n  " + "\n  ".join(errors))


def check_resume_config(cfg: TrainConfig, step: int, saved: Mapping[str, Any], allow_change: bool) -> None:
    """Refuse to continue checkpoint `step`, saved under config `saved`, with a different `cfg`: only the
    RESUMABLE_CHANGES keys may differ, unless `allow_change`; the BUDGET_KEYS never. Prints the changes it lets
    through."""
    if cfg.steps < step:
        raise ValueError(f"--resume: steps={cfg.steps} is below the checkpoint's step {step}; set steps >= {step}")
    changes, budget, refused = _resume_changes(cfg, saved)
    if budget:
        raise ValueError(f"--resume: checkpoint {step} was trained at a budget these keys set, which a resumed run "
                         "keeps:\n  " + "\n  ".join(_show(k, *changes[k]) for k in budget)
                         + "\nrestore those values, or start a new run (another out_dir) with the new ones")
    if refused and not allow_change:
        raise ValueError(f"--resume: the config differs from the one checkpoint {step} was saved with, so this would "
                         "continue a different run:\n  " + "\n  ".join(_show(k, *changes[k]) for k in refused)
                         + "\nrestore those values, or pass --allow-config-change to continue with the new ones")
    if changes:
        print(f"resume: config changes from checkpoint {step}: " + "; ".join(_show(k, *v) for k, v in changes.items()))


def resume_point(cfg: TrainConfig, required: bool = False, allow_change: bool = False) -> int | None:
    """The checkpoint step a run of `cfg` continues from, or None for a new run. required (--resume): there must be
    a checkpoint, and `check_resume_config` decides. Otherwise a checkpoint directory holding this run's checkpoints
    (one whose config differs at most in RESUMABLE_CHANGES: the same command restarted on a recreated pod or spot
    VM) is continued, and one holding another run's is refused before anything is written."""
    directory = run_checkpoints_dir(cfg)
    try:
        step, meta = newest_meta(directory)
    except FileNotFoundError:
        if required:
            raise
        return None
    if not required:
        changes, budget, refused = _resume_changes(cfg, meta["config"])
        differs = [_show(k, *changes[k]) for k in (*budget, *refused)]
        differs += [f"steps={cfg.steps} is below its step {step}"] if cfg.steps < step else []
        if differs:
            raise ValueError(
                f"{directory} holds another run's checkpoints (newest: step {step}), saved under another config:\n  "
                + "\n  ".join(differs) + "\nto continue that run, run its own command again (or add --resume, and "
                "--allow-config-change to keep these values); to start a new run, set out_dir (or checkpoint_dir) to "
                f"another directory, or delete {directory}")
        print(f"train: {directory} holds this run's checkpoint at step {step}; continuing from it (a new run needs "
              "another out_dir)")
    check_resume_config(cfg, step, meta["config"], allow_change)
    return step


def _resume_changes(cfg: TrainConfig, saved: Mapping[str, Any]) -> tuple[dict[str, tuple[Any, Any]], list[str],
                                                                         list[str]]:
    """(every changed key -> (old, new), the changed BUDGET_KEYS, the other changed keys outside
    RESUMABLE_CHANGES) between a checkpoint's config and `cfg`."""
    changes = _config_changes(saved, json.loads(json.dumps(to_dict(cfg))))  # as JSON stores it: tuples -> lists
    budget = [k for k in changes if k in BUDGET_KEYS]
    refused = [k for k in changes if k not in BUDGET_KEYS
               and not any(k == r or k.startswith(f"{r}.") for r in RESUMABLE_CHANGES)]
    return changes, budget, refused


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


def _show(key: str, old: Any, new: Any) -> str:
    return f"{key}: {old!r} -> {new!r}"


def _config_changes(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (old, new) for each leaf that differs; a key only one side has is <absent> on the other."""
    out = {}
    for key in [*old, *(k for k in new if k not in old)]:
        a, b = old.get(key, _Absent()), new.get(key, _Absent())
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out |= _config_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out
