"""Qwen3-architecture policy with a shared success head and its KV cache; HF checkpoint I/O is `models.hf_io`
(not re-exported here: it places weights with `trace_jax.sharding`, which builds on this package)."""

from trace_jax.models.cache import KVCache
from trace_jax.models.config import ModelConfig
from trace_jax.models.qwen3 import ModelOutput, Paged, Policy, with_predictor_layers

__all__ = ["KVCache", "ModelConfig", "ModelOutput", "Paged", "Policy", "with_predictor_layers"]
