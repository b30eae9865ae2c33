"""What the task families whose policy is a local HF Qwen3 checkpoint share (search QA, math): its tokenizer, and
its dims for the memory planner (from its config.json, or a public model's before the checkpoint is there)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from trace_jax.config import TrainConfig
from trace_jax.memory.plan import PRESETS
from trace_jax.models.config import ModelConfig


def load_tokenizer(policy_dir: str | Path, key: str, kit: str) -> PreTrainedTokenizerBase:
    """The tokenizer of the checkpoint in policy_dir; errors name the config key and the command writing a kit."""
    path = Path(policy_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{key}={path} holds no HF checkpoint (config.json); point it at a local Qwen3 "
                                f"directory, or write the tiny one with `{kit}`")
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
