"""Qwen3-architecture policy with a shared success head, its KV cache and HF checkpoint I/O."""

from trace_jax.models.cache import KVCache
from trace_jax.models.config import ModelConfig
from trace_jax.models.hf_io import from_pretrained, save_pretrained
from trace_jax.models.qwen3 import ModelOutput, Paged, Policy, with_predictor_layers

__all__ = ["KVCache", "ModelConfig", "ModelOutput", "Paged", "Policy", "from_pretrained", "save_pretrained",
           "with_predictor_layers"]
