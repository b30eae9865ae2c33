"""Qwen3-architecture model configuration, read from and written to HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_name(dtype: DTypeLike, what: str = "dtype") -> str:
    """The canonical name in DTYPES of `dtype`: one of those names, or a jnp / numpy dtype such as jnp.bfloat16.

    `what` names the argument in the error raised for anything else.
    """
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except (TypeError, ValueError):
            name = None
    if name not in DTYPES:
        raise ValueError(f"{what}={dtype!r} is not a supported dtype; use one of {sorted(DTYPES)} or the "
                         "matching jnp / numpy dtype (e.g. jnp.bfloat16)")
    return name


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a Qwen3 decoder plus the dtypes we run it in.

    `param_dtype` is the storage dtype of the weights, `dtype` the compute dtype of activations. Both accept a
    name in DTYPES or a jnp / numpy dtype, and are stored as the name, so equal dtypes give equal configs.
    """

    vocab_size: int  # tokens in the vocabulary
    hidden_size: int  # model width D
    intermediate_size: int  # MLP width
    num_layers: int  # decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA)
    head_dim: int  # width of one head
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    rope_theta: float = 1_000_000.0  # RoPE base
    tie_word_embeddings: bool = False  # the output projection reuses the embedding
    attention_bias: bool = False  # biases on q, k, v, o
    max_position_embeddings: int = 32768  # longest sequence the config declares
    param_dtype: str = "float32"  # storage dtype of the weights: float32 | bfloat16 | float16
    dtype: str = "float32"  # compute dtype of activations
    predictor_layers: int = 0  # the success predictor's own layers over the input of the top ones (not HF's)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model config: {name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.predictor_layers <= self.num_layers:
            raise ValueError(f"model config: predictor_layers must be in [0, num_layers={self.num_layers}] (copies of "
                             f"the top layers), got {self.predictor_layers}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model config: num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        for name in ("param_dtype", "dtype"):
            object.__setattr__(self, name, dtype_name(getattr(self, name), f"model config: {name}"))

    @property
    def cache_layers(self) -> int:
        """Layers with KV cache rows: the decoder's and the predictor's own."""
        return self.num_layers + self.predictor_layers

    @property
    def jnp_param_dtype(self) -> Any:
        return DTYPES[self.param_dtype]

    @property
    def jnp_dtype(self) -> Any:
        return DTYPES[self.dtype]

    def with_dtype(self, dtype: DTypeLike | None) -> ModelConfig:
        """A copy whose params and compute both use `dtype`, a name or jnp / numpy dtype (None: unchanged)."""
        if dtype is None:
            return self
        name = dtype_name(dtype, "with_dtype: dtype")
        return dataclasses.replace(self, param_dtype=name, dtype=name)

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Build from an HF Qwen3 config dict; reject what this implementation does not support."""
        model_type = hf.get("model_type")
        archs = hf.get("architectures") or []
        if model_type != "qwen3" or any(a != "Qwen3ForCausalLM" for a in archs):
            raise ValueError(f"{source}: model_type={model_type!r}, architectures={archs!r}; only Qwen3 "
                             "(model_type 'qwen3', Qwen3ForCausalLM) checkpoints are supported")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"{source}: rope type {rope_type!r} is not supported (only 'default')")
        theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
        if hf.get("use_sliding_window", False):
            raise ValueError(f"{source}: use_sliding_window=true is not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act={hf['hidden_act']!r}; only 'silu' is supported")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads")
        missing = [k for k in required if k not in hf]
        if missing:
            raise ValueError(f"{source}: missing required keys {missing}")
        heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=hf.get("attention_bias", False),
            max_position_embeddings=hf.get("max_position_embeddings", 32768),
        )

    @classmethod
    def from_hf_dir(cls, hf_dir: str | Path) -> ModelConfig:
        path = Path(hf_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no config.json; expected an HF checkpoint directory "
                                    "(config.json + model.safetensors)")
        try:
            hf = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from e
        return cls.from_hf_dict(hf, source=str(path))

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` fields transformers' Qwen3Config understands."""
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "use_sliding_window": False,
            "dtype": self.param_dtype,
        }
