"""Orbax checkpoints of everything a run needs to continue exactly: state, step, data position, budgets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from trace_jax.train.step import TrainState


class RunCheckpoints:
    """`out_dir/checkpoints/<step>/{state, meta}`; keeps the newest `keep` steps."""

    def __init__(self, directory: str | Path, keep: int) -> None:
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory, item_names=("state", "meta"),
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
            except Exception as e:  # orbax raises many kinds for truncated or missing files
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
