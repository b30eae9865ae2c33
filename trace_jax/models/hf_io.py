"""Import and export HF-layout Qwen3 checkpoints (config.json + safetensors) to and from `Policy`.

Import reads one tensor at a time and puts it straight onto its target sharding, so a model never
sits whole on one host. The success predictor, which HF does not know (its head, and its own layers if it has any),
lives in `success_head.safetensors`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.typing import DTypeLike
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from trace_jax.models.config import ModelConfig, dtype_name
from trace_jax.models.qwen3 import Policy

SUCCESS_HEAD_FILE = "success_head.safetensors"
Path_ = tuple[str | int, ...]
# (our param path, HF tensor name, HF array -> ours, ours -> HF array)
Entry = tuple[Path_, str, Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _layer_map(cfg: ModelConfig, ours: Path_, hf: str) -> Iterator[Entry]:
    """One decoder layer's parameters (ours under `ours`, HF's under `hf`) with their layout conversions."""
    d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    same = lambda a: a
    transpose = lambda a: a.T
    yield ours + ("input_layernorm", "weight"), f"{hf}.input_layernorm.weight", same, same
    yield ours + ("post_attention_layernorm", "weight"), f"{hf}.post_attention_layernorm.weight", same, same
    for name, heads in (("q", n), ("k", k), ("v", k)):
        yield (ours + ("self_attn", f"{name}_proj"), f"{hf}.self_attn.{name}_proj.weight",
               lambda a, heads=heads: a.T.reshape(d, heads, h),
               lambda a, heads=heads: a.reshape(d, heads * h).T)
        if cfg.attention_bias:
            yield (ours + ("self_attn", f"{name}_bias"), f"{hf}.self_attn.{name}_proj.bias",
                   lambda a, heads=heads: a.reshape(heads, h), lambda a: a.reshape(-1))
    yield (ours + ("self_attn", "o_proj"), f"{hf}.self_attn.o_proj.weight",
           lambda a: a.T.reshape(n, h, d), lambda a: a.reshape(n * h, d).T)
    if cfg.attention_bias:
        yield ours + ("self_attn", "o_bias"), f"{hf}.self_attn.o_proj.bias", same, same
    for name in ("q_norm", "k_norm"):
        yield ours + ("self_attn", name, "weight"), f"{hf}.self_attn.{name}.weight", same, same
    for name in ("gate_proj", "up_proj", "down_proj"):
        yield ours + ("mlp", name), f"{hf}.mlp.{name}.weight", transpose, transpose


def _weight_map(cfg: ModelConfig) -> Iterator[Entry]:
    """Every parameter of the Qwen3 decoder with its HF name and layout conversions."""
    same = lambda a: a
    yield ("embed_tokens",), "model.embed_tokens.weight", same, same
    for i in range(cfg.num_layers):
        yield from _layer_map(cfg, ("layers", i), f"model.layers.{i}")
    yield ("norm", "weight"), "model.norm.weight", same, same
    if not cfg.tie_word_embeddings:
        yield ("lm_head",), "lm_head.weight", lambda a: a.T, lambda a: a.T


def _success_map(cfg: ModelConfig) -> Iterator[Entry]:
    """The success predictor's parameters, which HF does not know: the head ("weight", "bias") and its own layers
    ("predictor.layers.{i}.*", "predictor.norm.weight", named as HF names a decoder's)."""
    yield ("success_kernel",), "weight", lambda a: a.reshape(-1), lambda a: a.reshape(1, -1)
    yield ("success_bias",), "bias", lambda a: a.reshape(()), lambda a: a.reshape(1)
    for i in range(cfg.predictor_layers):
        yield from _layer_map(cfg, ("predictor", i), f"predictor.layers.{i}")
    if cfg.predictor_layers:
        yield ("predictor_norm", "weight"), "predictor.norm.weight", lambda a: a, lambda a: a


def _predictor_layers(names: list[str]) -> int:
    """How many layers of its own the success predictor whose tensors are `names` has."""
    return len({name.split(".")[2] for name in names if name.startswith("predictor.layers.")})


def _weight_files(hf_dir: Path) -> dict[str, Path]:
    """HF tensor name -> file holding it, from a single file or a sharded index."""
    index = hf_dir / "model.safetensors.index.json"
    single = hf_dir / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{index}: not a valid safetensors index (needs a 'weight_map'): {e}") from e
        return {name: hf_dir / fname for name, fname in weight_map.items()}
    if single.is_file():
        return {name: single for name in _open(single).keys()}  # noqa: SIM118  (safetensors handle, not a dict)
    raise FileNotFoundError(f"{hf_dir}: no model.safetensors or model.safetensors.index.json; "
                            "expected HF safetensors weights beside config.json")


def _open(path: Path):
    if not path.is_file():
        raise FileNotFoundError(f"{path}: weight file listed in the index is missing")
    try:
        return safe_open(str(path), framework="numpy")
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: unreadable safetensors file (truncated or corrupt?): {e}") from e


def _read(handles: dict[Path, object], path: Path, name: str) -> np.ndarray:
    if path not in handles:
        handles[path] = _open(path)
    try:
        return handles[path].get_tensor(name)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: cannot read tensor {name!r} (truncated or corrupt file?): {e}") from e


def _load_into(flat_abstract: dict, entries: list[Entry], files: dict[str, Path],
               flat_shardings: dict, source: str) -> dict:
    """Read, convert, check and place each tensor; returns {our path: jax.Array}."""
    unexpected = sorted(set(files) - {hf_name for _, hf_name, _, _ in entries})
    if unexpected:
        raise ValueError(f"{source}: unexpected tensors for this Qwen3 config: {unexpected[:5]}"
                         f"{' ...' if len(unexpected) > 5 else ''} (does config.json match the weights?)")
    handles: dict[Path, object] = {}
    out = {}
    for ours, hf_name, to_ours, _ in entries:
        if hf_name not in files:
            raise KeyError(f"{source}: tensor {hf_name!r} is missing from the checkpoint")
        target = flat_abstract[ours].get_value()
        raw = _read(handles, files[hf_name], hf_name)
        try:
            value = to_ours(raw)
        except ValueError as e:
            raise ValueError(f"{files[hf_name]}: tensor {hf_name!r} has shape {raw.shape}, which does "
                             f"not fit the config (expected {target.shape} in our layout)") from e
        if value.shape != target.shape:
            raise ValueError(f"{files[hf_name]}: tensor {hf_name!r} has shape {raw.shape}; config.json "
                             f"implies {target.shape} (our layout), got {value.shape}")
        value = value.astype(target.dtype)
        out[ours] = jax.device_put(value, flat_shardings.get(ours))
    return out


def from_pretrained(hf_dir: str | Path, *, dtype: DTypeLike | None = None, compute_dtype: DTypeLike | None = None,
                    mesh: jax.sharding.Mesh | None = None, rules=None) -> Policy:
    """Load a local HF Qwen3 checkpoint directory into a `Policy`.

    dtype: params and compute dtype, "float32" | "bfloat16" | "float16" or the jnp / numpy dtype (default: float32).
    compute_dtype: the compute dtype alone, when it differs (mixed precision: float32 params, bfloat16 compute).
    mesh: if given, each tensor is placed on its NamedSharding from `trace_jax.sharding`.
    """
    from trace_jax import sharding as shd

    name = None if dtype is None else dtype_name(dtype, "from_pretrained: dtype")
    compute = None if compute_dtype is None else dtype_name(compute_dtype, "from_pretrained: compute_dtype")
    hf_dir = Path(hf_dir)
    head = hf_dir / SUCCESS_HEAD_FILE
    head_names = list(_open(head).keys()) if head.exists() else []
    cfg = ModelConfig.from_hf_dir(hf_dir).with_dtype(name)
    if compute is not None:
        cfg = dataclasses.replace(cfg, dtype=compute)
    if head.exists():
        cfg = dataclasses.replace(cfg, predictor_layers=_predictor_layers(head_names))
    abstract_model = nnx.eval_shape(lambda: Policy(cfg, nnx.Rngs(0)))
    graphdef, abstract = nnx.split(abstract_model)
    flat_abstract = dict(nnx.to_flat_state(abstract))
    flat_shardings = {} if mesh is None else {
        path: var.get_value() for path, var in nnx.to_flat_state(shd.param_shardings(abstract, mesh, rules))}
    loaded = _load_into(flat_abstract, list(_weight_map(cfg)), _weight_files(hf_dir), flat_shardings,
                        str(hf_dir))
    if head.exists():
        loaded |= _load_into(flat_abstract, list(_success_map(cfg)), dict.fromkeys(head_names, head),
                             flat_shardings, str(head))
    else:  # a plain HF checkpoint: start the success head at zero (V~ = 0.5)
        for ours, *_ in _success_map(cfg):
            target = flat_abstract[ours].get_value()
            loaded[ours] = jax.device_put(np.zeros(target.shape, target.dtype), flat_shardings.get(ours))
    state = nnx.from_flat_state([(path, var.replace(loaded[path])) for path, var in flat_abstract.items()])
    return nnx.merge(graphdef, state)


def save_pretrained(model: Policy, out_dir: str | Path) -> Path:
    """Write `model` as an HF Qwen3 checkpoint that transformers loads; returns `out_dir`. Across processes every
    process calls it (the parameters are gathered from all) and process 0 writes."""
    from trace_jax import sharding as shd

    out_dir = Path(out_dir)
    cfg = model.cfg
    flat = shd.to_host({path: var.get_value() for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))})
    if jax.process_index() > 0:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    def collect(entries: Iterator[Entry]) -> dict[str, np.ndarray]:
        return {hf: np.ascontiguousarray(to_hf(flat[ours])) for ours, hf, _, to_hf in entries}

    save_file(collect(_weight_map(cfg)), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(collect(_success_map(cfg)), str(out_dir / SUCCESS_HEAD_FILE))
    (out_dir / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    return out_dir
