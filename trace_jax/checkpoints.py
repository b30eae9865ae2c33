"""Orbax checkpoints of the policy (and its config), readable on any mesh."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from trace_jax.models.config import ModelConfig
from trace_jax.models.qwen3 import Policy


def checkpoint_path(directory: str | os.PathLike) -> epath.Path:
    """`directory` as orbax's path type: a URL (gs://bucket/x) kept as it is, a local path made absolute."""
    text = os.fspath(directory)
    return epath.Path(text if "://" in text else os.path.abspath(text))


STEP_FILE = "trace_jax_step.json"  # in an HF policy directory a run wrote: {"step": the training step it holds}


def write_step(directory: str | os.PathLike, step: int) -> None:
    """Records in an HF policy directory the training step whose parameters it holds (`policy_step` reads it)."""
    (epath.Path(directory) / STEP_FILE).write_text(json.dumps({"step": step}) + "\n")


def policy_step(directory: str | os.PathLike) -> int | None:
    """The training step a saved policy holds: an HF directory's `STEP_FILE`, an orbax policy's latest step; None
    for a checkpoint from elsewhere (an HF directory no run wrote)."""
    path = epath.Path(directory)
    if (path / STEP_FILE).is_file():
        return int(json.loads((path / STEP_FILE).read_text())["step"])
    if (path / "config.json").is_file() or not path.is_dir():
        return None
    with _manager(directory) as mngr:
        return mngr.latest_step()


def _manager(directory: str | os.PathLike) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(checkpoint_path(directory), item_names=("model", "model_config"))


def save_model(directory: str | os.PathLike, step: int, model: Policy) -> None:
    """Save `model`'s parameters and config as step `step` under `directory`."""
    with _manager(directory) as mngr:
        mngr.save(step, args=ocp.args.Composite(
            model=ocp.args.StandardSave(nnx.to_pure_dict(nnx.state(model, nnx.Param))),
            model_config=ocp.args.JsonSave(dataclasses.asdict(model.cfg)),
        ))
        mngr.wait_until_finished()


def load_model(directory: str | os.PathLike, step: int | None = None,
               mesh: jax.sharding.Mesh | None = None) -> Policy:
    """Restore the policy saved at `step` (default: latest), sharded on `mesh` if given, else on this process's
    first device."""
    from trace_jax import sharding as shd

    directory = checkpoint_path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no checkpoint directory")
    with _manager(directory) as mngr:
        step = mngr.latest_step() if step is None else step
        if step is None or step not in mngr.all_steps():
            raise FileNotFoundError(f"{directory}: no checkpoint at step {step}; "
                                    f"available steps: {list(mngr.all_steps())}")
        cfg = ModelConfig(**mngr.restore(step, args=ocp.args.Composite(
            model_config=ocp.args.JsonRestore()))["model_config"])
        graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Policy(cfg, nnx.Rngs(0))))
        if mesh is not None:
            shardings = shd.param_shardings(abstract, mesh)
            target = jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
                                  nnx.to_pure_dict(abstract), nnx.to_pure_dict(shardings))
        else:  # on this process's first device (a multi-host restore needs a sharding for every array)
            device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            target = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device),
                                  nnx.to_pure_dict(abstract))
        restored = mngr.restore(step, args=ocp.args.Composite(model=ocp.args.StandardRestore(target)))
    nnx.replace_by_pure_dict(abstract, restored["model"])
    return nnx.merge(graphdef, abstract)
