"""Qwen3-architecture decoder in Flax NNX with a scalar success head on the same backbone.

Parameters carry logical axis names in their `axes` metadata; `trace_jax.sharding` maps them to
mesh axes. Dimensions are named in words here (rows, positions, heads, ...); the rollout's shape
letters (B, M, N, S, T, ...) are defined in `rollout/tree.py`. Parameter layouts (ours; HF's are
transposed in `hf_io`): embed [vocab, hidden], q [hidden, heads, head_dim], k/v [hidden, kv_heads,
head_dim], o [heads, head_dim, hidden], gate/up [hidden, mlp], down [mlp, hidden], lm_head [hidden, vocab].
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from trace_jax.models.cache import KVCache, write_positions
from trace_jax.models.config import ModelConfig


def matmul(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
    """einsum(spec, x, w) in x's dtype (w cast to it), accumulated in float32: what a bfloat16 dot does on a TPU
    or GPU anyway, and on a CPU 2.5-6x faster than XLA:CPU's dot with a bfloat16 output (docs/engine.md: the sampler
    section). In float32, a plain einsum."""
    return jnp.einsum(spec, x, w.astype(x.dtype), preferred_element_type=jnp.float32).astype(x.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ModelOutput:
    logits: jax.Array  # [rows, positions, vocab] float32
    hidden: jax.Array  # [rows, positions, hidden] final normed hidden state, compute dtype
    success: jax.Array  # [rows, positions] float32, sigmoid of the success head
    cache: KVCache | None
    predictor_hidden: jax.Array  # [rows, positions, hidden] what the success head reads (`hidden` without own layers)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Paged:
    """Which keys each query sees in a forward without a cache, in place of the causal mask: a row's positions
    fall in blocks of equal size, and each block attends over its own list of the row's positions (a packed
    tree's block holds one slot's tokens and sees that slot's causal prefix wherever it lies in the row)."""

    keys: jax.Array  # [rows, blocks, seen] int32 the row's positions the block's queries may see
    attend: jax.Array  # [rows, blocks, block, seen] bool which of them each query sees


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], dtype,
           std: float = 0.02) -> nnx.Param:
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), axes=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype) -> None:
        self.weight = nnx.Param(jnp.ones((dim,), dtype), axes=("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * y.astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding (HF rotate-half convention). x [rows, positions, heads, head_dim], positions
    [rows, positions]."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [rows, positions, head_dim/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [rows, positions, 1, head_dim]
    cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        d, n, k, h, pd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.jnp_param_dtype
        self.q_proj = _param(rngs, (d, n, h), ("embed", "q_heads", "head_dim"), pd)
        self.k_proj = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pd)
        self.v_proj = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), pd)
        self.o_proj = _param(rngs, (n, h, d), ("q_heads", "head_dim", "embed"), pd)
        if cfg.attention_bias:
            self.q_bias = nnx.Param(jnp.zeros((n, h), pd), axes=("q_heads", "head_dim"))
            self.k_bias = nnx.Param(jnp.zeros((k, h), pd), axes=("kv_heads", "head_dim"))
            self.v_bias = nnx.Param(jnp.zeros((k, h), pd), axes=("kv_heads", "head_dim"))
            self.o_bias = nnx.Param(jnp.zeros((d,), pd), axes=("embed",))
        self.q_norm = RMSNorm(h, cfg.rms_norm_eps, pd)
        self.k_norm = RMSNorm(h, cfg.rms_norm_eps, pd)
        self.cfg = cfg

    def _project(self, x: jax.Array, name: str) -> jax.Array:
        y = matmul("btd,dnh->btnh", x, getattr(self, f"{name}_proj")[...])
        if self.cfg.attention_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(x.dtype)
        return y

    def __call__(self, x: jax.Array, positions: jax.Array, layer_kv: tuple[jax.Array, jax.Array] | None,
                 paged: Paged | None = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x [rows, positions, hidden], positions [rows, positions] (RoPE positions); layer_kv: this
        layer's cache ([rows, kv_heads, cache_len, head_dim] each) or None; paged (without a cache): the keys
        each block of queries sees, in place of the causal mask."""
        cfg = self.cfg
        q = rope(self.q_norm(self._project(x, "q")), positions, cfg.rope_theta)  # [rows, positions, heads, head_dim]
        k = rope(self.k_norm(self._project(x, "k")), positions, cfg.rope_theta)  # [rows, positions, kv_heads, head_dim]
        v = self._project(x, "v")
        if paged is not None:
            return self._paged(x, q, k, v, paged), None
        if layer_kv is None:  # keys and values [rows, kv_heads, positions, head_dim], the cache's layout
            keys, values, key_pos = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), positions
        else:
            keys, values = write_positions(layer_kv[0], positions, k), write_positions(layer_kv[1], positions, v)
            key_pos = jnp.broadcast_to(jnp.arange(keys.shape[2]), (keys.shape[0], keys.shape[2]))
        b, t, n, h = q.shape
        groups = n // cfg.num_kv_heads
        qg = q.reshape(b, t, cfg.num_kv_heads, groups, h)
        scores = matmul("btkgh,bksh->bkgts", qg, keys).astype(jnp.float32) * (h ** -0.5)
        attend = key_pos[:, None, :] <= positions[:, :, None]  # [rows, positions, cache_len] causal
        scores = jnp.where(attend[:, None, None], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        # the weighted sum in the dot's own output order, then the heads moved behind the positions: asked for
        # [rows, positions, ...] directly, XLA:CPU runs it as a slow transposed batched dot
        out = matmul("bkgts,bksh->bkgth", probs, values)
        out = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, n, h)
        return self._out(out), (None if layer_kv is None else (keys, values))

    def _out(self, out: jax.Array) -> jax.Array:
        """[rows, positions, heads, head_dim] attention outputs -> [rows, positions, hidden]."""
        b, t, n, h = out.shape
        # heads and head_dim as one contracted axis, in the weight's own order: contracted as two, XLA:CPU copies
        # the weight into [head_dim, heads, hidden] at every decode step (4 MB a layer at 134M)
        y = matmul("btf,fd->btd", out.reshape(b, t, n * h), self.o_proj[...].reshape(n * h, -1))
        return y + self.o_bias[...].astype(out.dtype) if self.cfg.attention_bias else y

    def _paged(self, x: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, paged: Paged) -> jax.Array:
        """Attention of each block of queries over keys gathered from its row: q [rows, positions, heads,
        head_dim], k and v [rows, positions, kv_heads, head_dim] -> [rows, positions, hidden]."""
        b, t, n, h = q.shape
        _, blocks, size, seen = paged.attend.shape
        kv = self.cfg.num_kv_heads
        qg = q.reshape(b, blocks, size, kv, n // kv, h)
        gather = jax.vmap(lambda rows, index: rows[index])  # [rows, positions, ...] at [rows, blocks, seen]
        keys, values = gather(k, paged.keys), gather(v, paged.keys)  # [rows, blocks, seen, kv_heads, head_dim]
        scores = matmul("bctkgh,bcskh->bckgts", qg, keys).astype(jnp.float32) * (h ** -0.5)
        scores = jnp.where(paged.attend[:, :, None, None], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        out = matmul("bckgts,bcskh->bckgth", probs, values)
        return self._out(jnp.transpose(out, (0, 1, 4, 2, 3, 5)).reshape(b, t, n, h))


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        d, f, pd = cfg.hidden_size, cfg.intermediate_size, cfg.jnp_param_dtype
        self.gate_proj = _param(rngs, (d, f), ("embed", "mlp"), pd)
        self.up_proj = _param(rngs, (d, f), ("embed", "mlp"), pd)
        self.down_proj = _param(rngs, (f, d), ("mlp", "embed"), pd)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = matmul("...d,df->...f", x, self.gate_proj[...])
        up = matmul("...d,df->...f", x, self.up_proj[...])
        return matmul("...f,fd->...d", jax.nn.silu(gate) * up, self.down_proj[...])


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.jnp_param_dtype)
        self.self_attn = Attention(cfg, rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.jnp_param_dtype)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x, positions, layer_kv, paged=None):
        attn, layer_kv = self.self_attn(self.input_layernorm(x), positions, layer_kv, paged)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), layer_kv


class Policy(nnx.Module):
    """The Qwen3 decoder (policy) and the success predictor V~(H), sharing one backbone: a linear head on the last
    hidden state, or (cfg.predictor_layers = P) on the output of P layers of its own over the input of the top P."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
        pd = cfg.jnp_param_dtype
        self.cfg = cfg
        self.embed_tokens = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        self.layers = nnx.List([DecoderLayer(cfg, rngs) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd)
        if not cfg.tie_word_embeddings:
            self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)
        if cfg.predictor_layers:  # the predictor's own layers over the input of the top ones (`with_predictor_layers`)
            self.predictor = nnx.List([DecoderLayer(cfg, rngs) for _ in range(cfg.predictor_layers)])
            self.predictor_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd)
        # The success head starts at zero: V~ = 0.5 everywhere until trained.
        self.success_kernel = nnx.Param(jnp.zeros((cfg.hidden_size,), jnp.float32), axes=("embed",))
        self.success_bias = nnx.Param(jnp.zeros((), jnp.float32), axes=())

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """LM head on final normed hidden states [..., hidden] -> float32 logits [..., vocab]."""
        head = self.embed_tokens[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]
        return matmul("...d,dv->...v", hidden, head).astype(jnp.float32)

    def success_logit(self, hidden: jax.Array) -> jax.Array:
        """The success head's logit: a linear read of the predictor's hidden state [..., hidden] -> [...] float32."""
        return hidden.astype(jnp.float32) @ self.success_kernel[...] + self.success_bias[...]

    def success_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """Success head V~: the sigmoid of `success_logit` of the predictor's hidden state [..., hidden] -> [...]."""
        return jax.nn.sigmoid(self.success_logit(hidden))

    def remat_layers(self, layers: list[DecoderLayer], x: jax.Array, positions: jax.Array,
                     paged: Paged | None = None) -> jax.Array:
        """`layers` over x [rows, positions, hidden] without a cache (paged: as in `Attention`; None: causal), as
        one `lax.scan` over their stacked weights whose body is rematerialised: a gradient keeps each layer's input
        only and recomputes one layer at a time in the backward (the loop makes any backend's scheduler do so).
        Costs a stacked copy of the layers' weights and one more forward."""
        graphdef, _ = nnx.split(layers[0])
        stacked = jax.tree.map(lambda *w: jnp.stack(w), *(nnx.state(layer) for layer in layers))

        @jax.checkpoint
        def body(x: jax.Array, weights: nnx.State) -> tuple[jax.Array, None]:
            return nnx.merge(graphdef, weights)(x, positions, None, paged)[0], None

        return jax.lax.scan(body, x, stacked)[0]

    def _stack(self, layers: list[DecoderLayer], x: jax.Array, positions: jax.Array, cache: KVCache | None,
               first: int, paged: Paged | None, remat: bool) -> tuple[jax.Array, list[tuple[jax.Array, jax.Array]]]:
        """(x after `layers`, their new (keys, values) if cache) with cache rows first, first + 1, ... of `cache`."""
        if not layers:
            return x, []
        if remat:
            return self.remat_layers(layers, x, positions, paged), []
        new_kv = []
        for i, layer in enumerate(layers):
            layer_kv = None if cache is None else (cache.k[first + i], cache.v[first + i])
            x, layer_kv = layer(x, positions, layer_kv, paged)
            if layer_kv is not None:
                new_kv.append(layer_kv)
        return x, new_kv

    def predictor_input(self, input_ids: jax.Array) -> jax.Array:
        """[rows, positions, hidden] what the predictor's own layers read in a causal forward of `input_ids` [rows,
        positions] without a cache: the output of the layers below them. With the policy frozen it is fixed, so a
        fit of the predictor alone can compute it once (`predictor_hidden_from`)."""
        b, t = input_ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        below = list(self.layers)[:self.cfg.num_layers - self.cfg.predictor_layers]
        return self._stack(below, self._embed(input_ids), positions, None, 0, None, False)[0]

    def predictor_hidden_from(self, x: jax.Array) -> jax.Array:
        """[rows, positions, hidden] `ModelOutput.predictor_hidden` from `predictor_input`'s x (causal, no cache)."""
        b, t, _ = x.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        return self.predictor_norm(self._stack(list(self.predictor), x, positions, None, 0, None, False)[0])

    def _embed(self, input_ids: jax.Array) -> jax.Array:
        return jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(self.cfg.jnp_dtype)

    def __call__(self, input_ids: jax.Array, *, cache: KVCache | None = None,
                 num_valid: jax.Array | None = None, remat: bool = False, positions: jax.Array | None = None,
                 paged: Paged | None = None, predictor_grad: bool = True) -> ModelOutput:
        """Forward `input_ids` [rows, positions].

        Without a cache: a causal pass over positions 0..n-1 (pads at the end are harmless); remat: through
        `remat_layers` (the same values; a gradient saves far less). A packed forward (`train.packing`) gives
        each token its RoPE position, positions [rows, positions], and the keys it sees, `paged`, in place of the
        causal mask.
        With a cache: row b's tokens go to positions cache.lengths[b] + t; `num_valid` [rows] (default
        all n) of them are real and the returned cache's lengths advance by that much.
        predictor_grad False: a gradient of V~ stops at the predictor's input (the policy's layers get none).
        """
        if remat and cache is not None:
            raise ValueError("remat applies to a forward without a cache (the training loss), not to decoding")
        if cache is not None and (positions is not None or paged is not None):
            raise ValueError("positions and paged apply to a forward without a cache (the packed training loss), "
                             "not to decoding: a cache sets each row's positions and attends causally")
        b, t = input_ids.shape
        cfg = self.cfg
        if positions is None:
            start = jnp.zeros((b,), jnp.int32) if cache is None else cache.lengths
            positions = start[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [rows, positions]
        x = self._embed(input_ids)
        below = cfg.num_layers - cfg.predictor_layers  # the predictor's own layers read the input of the top ones
        layers = list(self.layers)
        x, kv_below = self._stack(layers[:below], x, positions, cache, 0, paged, remat)
        top, kv_top = self._stack(layers[below:], x, positions, cache, below, paged, remat)
        hidden = self.norm(top)
        kv_predictor = []
        if cfg.predictor_layers:
            read = x if predictor_grad else jax.lax.stop_gradient(x)
            read, kv_predictor = self._stack(list(self.predictor), read, positions, cache, cfg.num_layers, paged,
                                             remat)
            read = self.predictor_norm(read)
        else:
            read = hidden if predictor_grad else jax.lax.stop_gradient(hidden)
        logits, success = self.logits_from_hidden(hidden), self.success_from_hidden(read)
        new_cache = None
        if cache is not None:
            valid = jnp.full((b,), t, jnp.int32) if num_valid is None else num_valid.astype(jnp.int32)
            new_kv = kv_below + kv_top + kv_predictor
            new_cache = KVCache(k=tuple(k for k, _ in new_kv), v=tuple(v for _, v in new_kv),
                                lengths=cache.lengths + valid)
        return ModelOutput(logits=logits, hidden=hidden, success=success, cache=new_cache, predictor_hidden=read)


def with_predictor_layers(model: Policy, layers: int) -> Policy:
    """`model` whose success predictor has `layers` layers of its own: copies of its top `layers` layers and final
    norm, with the success head at zero (V~ = 0.5 until the warm-up fits it). The policy's parameters are shared
    with `model`, not copied. A model that already has them is returned as it is."""
    cfg = model.cfg
    if cfg.predictor_layers == layers:
        return model
    if cfg.predictor_layers:
        raise ValueError(f"the policy already has {cfg.predictor_layers} predictor layers, and {layers} were asked "
                         "for: set predictor_layers to the checkpoint's, or start from a policy without them")
    grown = nnx.eval_shape(lambda: Policy(dataclasses.replace(cfg, predictor_layers=layers), nnx.Rngs(0)))
    for name in ("embed_tokens", "layers", "norm") + (() if cfg.tie_word_embeddings else ("lm_head",)):
        setattr(grown, name, getattr(model, name))
    grown.predictor = nnx.List([nnx.clone(layer) for layer in list(model.layers)[cfg.num_layers - layers:]])
    grown.predictor_norm = nnx.clone(model.norm)
    for name, axes in (("success_kernel", ("embed",)), ("success_bias", ())):
        old = getattr(model, name)[...]
        setattr(grown, name, nnx.Param(jax.device_put(jnp.zeros(old.shape, old.dtype), old.sharding), axes=axes))
    return grown
