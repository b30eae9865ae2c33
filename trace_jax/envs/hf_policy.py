"""What the task families whose policy is a local HF Qwen3 checkpoint share (search QA, math, BFCL): its tokenizer,
the base policy loaded from it, its dims for the memory planner (from its config.json, or a public model's before the
checkpoint is there), the trained policy saved and read back as an HF checkpoint, and prompt pools drawn from a set
of tokenized prompts; `HFTask`, the Task methods built from them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from jax.sharding import Mesh
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from trace_jax import distributed
from trace_jax import sharding as shd
from trace_jax.checkpoints import load_model, write_step
from trace_jax.config import TrainConfig
from trace_jax.memory.plan import PRESETS
from trace_jax.models.config import ModelConfig
from trace_jax.models.hf_io import from_pretrained, save_pretrained
from trace_jax.models.qwen3 import Policy, with_predictor_layers
from trace_jax.rollout.expand import Pool

TOKENIZER_FILE = "tokenizer_config.json"  # what every HF tokenizer directory holds (with tokenizer.json, ...)


def missing_tokenizer(policy_dir: str | Path, key: str) -> list[str]:
    """[] when policy_dir holds a tokenizer, else the line naming what to stage there (`Family.missing_inputs`)."""
    path = Path(policy_dir)
    return [] if (path / TOKENIZER_FILE).is_file() else [
        f"{key}={path}: the policy's tokenizer ({TOKENIZER_FILE}, tokenizer.json, ...; the HF checkpoint's files)"]


def load_tokenizer(policy_dir: str | Path, key: str, kit: str) -> PreTrainedTokenizerBase:
    """The tokenizer of the checkpoint in policy_dir (its weights may come later: a smoke run on random weights);
    errors name the config key and the command writing a kit."""
    path = Path(policy_dir)
    if not (path / TOKENIZER_FILE).is_file():
        raise FileNotFoundError(f"{key}={path} holds no tokenizer ({TOKENIZER_FILE}); point it at a local Qwen3 "
                                f"directory (config.json, safetensors, tokenizer), or write the tiny one with `{kit}`")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        raise ValueError(f"the tokenizer in {path} has no pad token; set pad_token in its tokenizer_config.json")
    return tokenizer


def policy_dims(policy_dir: str | Path, dtype: str, cfg: TrainConfig, preset: str | None
                ) -> tuple[ModelConfig, str]:
    """<policy_dir>/config.json with float32 params computing in dtype, as a run loads it; `preset` names PRESETS
    dims to use when that file is absent. (dims, their source)."""
    grow = lambda m: dataclasses.replace(m, predictor_layers=cfg.predictor_layers, param_dtype="float32", dtype=dtype)
    path = Path(policy_dir) / "config.json"
    if path.is_file():
        return grow(ModelConfig.from_hf_dir(path.parent)), str(path)
    if preset is None:
        raise FileNotFoundError(f"{path} does not exist; put the checkpoint's config.json there, or plan with the "
                                f"dims of a public model: --preset one of {sorted(PRESETS)}")
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r} is not one of {sorted(PRESETS)}")
    return grow(PRESETS[preset]), f"preset {preset} (no {path})"


def load_policy(policy_dir: str | Path, dtype: str, predictor_layers: int, mesh: Mesh | None = None) -> Policy:
    """The base policy: policy_dir's weights in float32, computing in dtype, with the predictor's own layers when
    predictor_layers asks for them."""
    return with_predictor_layers(from_pretrained(policy_dir, compute_dtype=dtype, mesh=mesh), predictor_layers)


def pad_prompts(prompts: list[list[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [n, width] right-padded with pad_id, lengths [n]) of n tokenized prompts no longer than width."""
    tokens = np.full((len(prompts), width), pad_id, np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    return tokens, np.asarray([len(p) for p in prompts], np.int32)


def draw_pool(ids: np.ndarray, tokens: np.ndarray, lengths: np.ndarray, size: int, seed: tuple[int, ...],
              mesh: Mesh | None) -> Pool:
    """`size` prompts drawn from the set (question ids [n], tokens [n, P], lengths [n]) by a generator seeded with
    `seed` alone (e.g. (run seed, stream, step)), with replacement only when the set is smaller; rows on mesh."""
    rows = np.random.default_rng(list(seed)).choice(len(ids), size, replace=len(ids) < size)
    return shd.rows_on(Pool(tokens=tokens[rows], lengths=lengths[rows], question=ids[rows]), mesh)


def save_hf(model: Policy, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path, step: int) -> Path:
    """<out_dir>/hf, an HF checkpoint with its tokenizer (it loads in transformers' Qwen3ForCausalLM, and back here
    with from_pretrained) and the training step it holds (`checkpoints.policy_step`); every process gathers, process 0
    writes."""
    hf_dir = Path(out_dir) / "hf"
    save_pretrained(model, hf_dir)
    if distributed.is_main():
        tokenizer.save_pretrained(hf_dir)
        write_step(hf_dir, step)
    return hf_dir


def load_hf(path: str | Path, dtype: str) -> Policy:
    """An HF directory (e.g. <run>/hf) computing in dtype, or an orbax policy checkpoint."""
    if (Path(path) / "config.json").is_file():
        return from_pretrained(path, compute_dtype=dtype)
    return load_model(path)


class HFTask:
    """The Task methods (`envs.family.Task`) of a family whose policy is a local HF Qwen3 checkpoint and whose
    training prompts are a tokenized set: pools drawn from (seed, stream, step) alone, so a resumed run and every
    process see the same pools (stream 0: training, 1: the predictor warm-up); the base policy; the trained policy as
    an HF checkpoint. A subclass sets `cfg` and `tokenizer` and names `source` (its config section, with policy_dir
    and dtype) and `training` (ids [n], tokens [n, P], lengths [n])."""

    cfg: TrainConfig
    tokenizer: PreTrainedTokenizerBase

    @property
    def source(self):  # the config section naming policy_dir and dtype
        raise NotImplementedError

    @property
    def training(self):  # the training prompts: ids, tokens, lengths
        raise NotImplementedError

    def _pool(self, step: int, mesh: Mesh | None, stream: int) -> Pool:
        t = self.training
        return draw_pool(t.ids, t.tokens, t.lengths, self.cfg.pool_size, (self.cfg.seed, stream, step), mesh)

    def pool(self, step: int, mesh: Mesh | None) -> Pool:
        return self._pool(step, mesh, stream=0)

    def warmup_pool(self, batch: int, mesh: Mesh | None) -> Pool:
        return self._pool(batch, mesh, stream=1)

    def base_policy(self, mesh: Mesh | None) -> Policy:
        return load_policy(self.source.policy_dir, self.source.dtype, self.cfg.predictor_layers, mesh)

    def save_policy(self, model: Policy, out_dir: Path) -> Path:
        return save_hf(model, self.tokenizer, out_dir, self.cfg.steps)

    def load_policy(self, path: Path) -> Policy:
        return load_hf(path, self.source.dtype)
