"""The analytic model of one training step's per-chip bytes: each term is the arrays the code allocates, sized
with the logical axes and rules of `sharding.py` (rows over data x fsdp, heads / mlp / vocab over tensor, a mesh
axis that does not divide a dimension dropped), never a fitted constant. Letters: see `rollout/tree.py`.

The step (`train.step.build_step`; the host path's `rollout.host` + `build_update` holds the same arrays) lives
in two phases that never overlap, beside state that lives throughout:
  state     the policy's parameters (+ the frozen reference when kl_coef > 0), Adam's two moments per parameter
            (both optimizer groups), the rollout tree of all S slots;
  rollout   stage 1 (the pool's prefill cache [B, P] and the roots' cache [M, L], the prefill's temporaries),
            the forks (the roots' cache), then the turns (the KV cache of every slot, [S, L], and the observation
            forward's temporaries); on a mesh whose batch axes split the rows, a copy of rows by index (a root's
            prompt rows, a fork's prefix) gathers its source cache whole onto every chip (`gather_bytes`);
  loss      what autodiff saves for the backward of every layer over [S, L] (attention scores are
            [S, heads, L, L]), the loss head's [S, L, V] float32 arrays, the gradients.
Peak per chip = state + max(rollout, loss). With `chunk_slots` (`train.chunked`), the rollout and the loss hold a
chunk's slots instead of all S; the tree stays whole. XLA's fusion (which drops some residuals) and its scratch are not
modelled: `tests/test_memory_plan.py` measures the model against XLA's buffer assignment of the compiled step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

from jax.sharding import AbstractMesh

from trace_jax.models.cache import KVCache
from trace_jax.models.config import ModelConfig
from trace_jax.sharding import logical_spec


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The static shapes of one training step, read off a TrainConfig."""

    model: ModelConfig
    model_source: str  # where the dims come from (sft.model, a config.json, or a named preset)
    pool: int  # B prompts prefilled per step
    prompt_width: int  # P
    roots: int  # M root rollouts
    continuations: int  # N per root (0: none)
    largest_group: int  # the most root rollouts one prompt can get (G, or TRACE's max_roots_per_prompt, or M)
    max_turns: int  # T
    slot_len: int  # L = P + T * (A + O)
    obs_len: int  # O tokens of an observation (its forward feeds O + 1: the turn's last token first)
    reference: bool  # a frozen reference copy of the policy (kl_coef > 0)
    remat: bool = False  # the loss forward through `Policy.remat_layers` (train.remat)

    @property
    def slots(self) -> int:
        """S = M * (1 + N) slots of the whole tree."""
        return self.roots * (1 + self.continuations)

    @property
    def prompt_slots(self) -> int:
        """Slots of the largest tree one prompt can get: a chunk holds whole prompts, so none is smaller."""
        return self.largest_group * (1 + self.continuations)


class Sizer:
    """Per-chip bytes of arrays given by (shape, logical axes, bytes per element) on a (data, fsdp, tensor) mesh,
    with `sharding.RULES` and its drop rule."""

    def __init__(self, mesh: Sequence[int]) -> None:
        self.mesh = AbstractMesh(tuple(mesh), ("data", "fsdp", "tensor"))

    def __call__(self, shape: Sequence[int], axes: Sequence[str | None], itemsize: float) -> float:
        split = 1
        for entry in logical_spec(axes, shape, self.mesh):
            for ax in (entry,) if isinstance(entry, str) else (entry or ()):
                split *= self.mesh.shape[ax]
        return math.prod(shape) * itemsize / split


@functools.lru_cache(maxsize=32)
def param_bytes(model: ModelConfig, mesh: tuple[int, int, int]) -> float:
    """Per-chip bytes of the policy's parameters, from the shapes and axes `models.qwen3.Policy` creates. The layers
    are identical, so a 1-layer and a 2-layer policy give everything: the rest, plus num_layers x one layer (and
    the predictor's own: P layers and a norm, what a P-layer policy gains with them)."""
    one, two = (_param_bytes(dataclasses.replace(model, num_layers=n, predictor_layers=0), mesh) for n in (1, 2))
    p = model.predictor_layers
    own = (_param_bytes(dataclasses.replace(model, num_layers=p), mesh)
           - _param_bytes(dataclasses.replace(model, num_layers=p, predictor_layers=0), mesh)) if p else 0.0
    return one + (model.num_layers - 1) * (two - one) + own


def _param_bytes(model: ModelConfig, mesh: tuple[int, int, int]) -> float:
    import jax
    from flax import nnx

    from trace_jax.models.qwen3 import Policy

    size = Sizer(mesh)
    abstract = nnx.state(nnx.eval_shape(lambda: Policy(model, nnx.Rngs(0))))
    total = 0.0
    for var in jax.tree.leaves(abstract, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        value = var.get_value()
        axes = var.get_metadata().get("axes") or (None,) * len(value.shape)
        total += size(value.shape, axes, value.dtype.itemsize)
    return total


def layer_residuals(model: ModelConfig, rows: int, positions: int, size: Sizer) -> float:
    """Per-chip bytes autodiff saves for the backward of one decoder layer (`models.qwen3.DecoderLayer`) over
    [rows, positions] tokens (keys: the same positions), line by line of its code; c: the compute dtype.
      each RMSNorm of the residual stream: x in float32, y in c, the weighted y in c -> 2 x [rows, positions, D]
      q_norm / k_norm: the head in float32 and in c; rope: cos and sin [rows, positions, 1, head_dim] in c (x2)
      q (reshaped into KV groups), k after rope, v, the attention output: [rows, positions, heads, head_dim] in c
      scores after the causal mask and their exp in float32, the mask (bool), the probabilities in c:
        [rows, heads, positions, positions] each
      the MLP's gate, up, silu (three saved values) and their product in c: 6 x [rows, positions, mlp]
    plus [rows, positions, heads] float32 reductions of the norms and softmax. With param_dtype != dtype the
    weights' compute-dtype copies are saved too (counted by `activation_bytes`)."""
    m, c = model, _itemsize(model.dtype)
    d, f, hd, nq, nk = m.hidden_size, m.intermediate_size, m.head_dim, m.num_heads, m.num_kv_heads
    rp = (rows, positions)
    tok = ("batch", "seq")
    stream = 2 * size((*rp, d), (*tok, None), 4 + 2 * c) + 4 * size(rp, tok, 4)
    q = size((*rp, nq, hd), (*tok, "q_heads", "head_dim"), 4 + 3 * c) + 2 * size((*rp, nq), (*tok, "q_heads"), 4)
    k = size((*rp, nk, hd), (*tok, "kv_heads", "head_dim"), 4 + 3 * c) + 2 * size((*rp, nk), (*tok, "kv_heads"), 4)
    rope = 4 * size((*rp, hd), (*tok, "head_dim"), c)
    scores = size((rows, nq, positions, positions), ("batch", "q_heads", "seq", "cache_seq"), 4 + 4 + 1 + c)
    softmax = 2 * size((rows, nq, positions), ("batch", "q_heads", "seq"), 4)
    mlp = 6 * size((*rp, f), (*tok, "mlp"), c)
    return stream + q + k + rope + scores + softmax + mlp


def activation_bytes(shape: StepShape, rows: int, size: Sizer, policy_params: float) -> float:
    """Per-chip bytes of the loss phase over `rows` slots: every layer's residuals (`layer_residuals`; with remat,
    every layer's input, one layer's residuals and two stacked copies of the layers' weights), the final
    norm, the loss head's four float32 [rows, L, V] arrays (the logits, their log-softmax saved for the
    backward, the entropy's exp(log p) and the logits' cotangent; with a KL term one more, the reference's
    log-softmax), the gradients (policy-sized; twice in chunks,
    `train.chunked` adds each chunk's to the running sum), and the weights' compute-dtype copies when they are
    stored in another dtype."""
    m, length = shape.model, shape.slot_len
    layers = m.cache_layers * layer_residuals(m, rows, length, size)  # the policy's and the predictor's own
    if shape.remat:  # each layer's input, one layer's residuals at a time, the stacked weights and their gradient
        mesh = tuple(size.mesh.axis_sizes)
        one, two = (param_bytes(dataclasses.replace(m, num_layers=n, predictor_layers=0), mesh) for n in (1, 2))
        stacked = m.cache_layers * (two - one)
        layers = (m.cache_layers * size((rows, length, m.hidden_size), ("batch", "seq", None), _itemsize(m.dtype))
                  + layer_residuals(m, rows, length, size) + 2 * stacked)
    norm = size((rows, length, m.hidden_size), ("batch", "seq", None), 4 + 2 * _itemsize(m.dtype))
    head = 4 * size((rows, length, m.vocab_size), ("batch", "seq", "vocab"), 4)
    if shape.reference:  # the frozen reference's float32 log-softmax, made beside the loss
        head += size((rows, length, m.vocab_size), ("batch", "seq", "vocab"), 4)
    casts = policy_params * _itemsize(m.dtype) / _itemsize(m.param_dtype) if m.dtype != m.param_dtype else 0.0
    grads = policy_params * (2 if rows < shape.slots else 1)
    return layers + norm + head + grads + casts


def kv_bytes(model: ModelConfig, rows: int, positions: int, size: Sizer, gathered: bool = False) -> float:
    """Per-chip bytes of a `models.cache.KVCache` of `rows` x `positions`: k and v, every layer (the predictor's
    own too), compute dtype. gathered: every row on every chip (the rows not split over the batch axes), as a gather
    of rows by index collects them (`gather_bytes`)."""
    shape = KVCache.layer_shape(model, rows, positions)
    axes = (None,) + KVCache.AXES[1:] if gathered else KVCache.AXES
    return 2 * model.cache_layers * size(shape, axes, _itemsize(model.dtype))


def gather_bytes(model: ModelConfig, rows: int, positions: int, size: Sizer) -> float:
    """Per-chip bytes a copy of cache rows by index (`KVCache.take`: a fork from the roots' cache, a root from the
    pool's prefill) adds when the batch axes split the rows: the partitioner all-gathers the source cache, every
    layer of it, onto each chip before the copy (XLA's buffer assignment holds the layers' gathers together);
    nothing on one data shard, where the copy reads the source in place."""
    whole = kv_bytes(model, rows, positions, size, gathered=True)
    return 0.0 if whole == kv_bytes(model, rows, positions, size) else whole


def forward_temps(model: ModelConfig, rows: int, fed: int, keys: int, size: Sizer) -> float:
    """Per-chip bytes of one cached forward's temporaries (`models.qwen3.Policy.__call__` with a cache, no
    gradient): inside a layer, the attention scores and probabilities [rows, heads, fed, keys] (float32 x 2, the
    mask; the cache's keys and values are read in place); they die before the head's float32 logits, which the
    engine makes at one position per row [rows, V] (`rollout.engine`, `models.decode.prefill`), so the larger of
    the two."""
    logits = size((rows, model.vocab_size), ("batch", "vocab"), 4)
    attn = size((rows, model.num_heads, fed, keys), ("batch", "q_heads", "seq", "cache_seq"), 4 + 4 + 1)
    return max(logits, attn)


def step_bytes(shape: StepShape, slots: int, mesh: Sequence[int]) -> dict[str, float]:
    """Per-chip bytes of each term of the step when `slots` slots are in flight (rollout and loss alike)."""
    size, m, length = Sizer(mesh), shape.model, shape.slot_len
    policy = param_bytes(m, tuple(mesh))
    roots = slots // (1 + shape.continuations)  # a chunk's R roots (all M at S slots), then R * N continuations
    turn_rows = max(roots, slots - roots)
    # Stage 1 prefills the pool (a chunk: its roots' prompts, `rollout.chunks.start_chunk`) and copies each root's
    # prompt rows into the roots' cache; with the rows split, the prefilled cache is gathered onto each chip first.
    prefilled = shape.pool if slots >= shape.slots else roots
    roots_cache = kv_bytes(m, roots, length, size)
    stage1 = (kv_bytes(m, prefilled, shape.prompt_width, size) + roots_cache
              + gather_bytes(m, prefilled, shape.prompt_width, size))
    stage1_temps = forward_temps(m, prefilled, shape.prompt_width, shape.prompt_width, size)
    # The rows running turns: the roots, then their continuations. A fork copies the roots' cache into the
    # continuations' rows, each root layer dying once copied (the roots' turns are over); with the rows split over
    # the batch axes, the roots' whole cache is gathered onto each chip first, beside the roots' own rows, between
    # the two phases' forwards.
    turns = kv_bytes(m, turn_rows, length, size)
    fork = roots_cache + gather_bytes(m, roots, length, size) if shape.continuations else 0.0
    turn_temps = forward_temps(m, turn_rows, shape.obs_len + 1, length, size)  # `engine.append_observation`
    tree = (size((shape.slots, length), ("batch", "seq"), 4 + 1 + 4)
            + size((shape.slots, shape.max_turns, m.hidden_size), ("batch", None, None), _itemsize(m.dtype)))
    return {"params_bytes": policy * (2 if shape.reference else 1), "optimizer_bytes": 2 * policy,
            "tree_bytes": tree, "kv_cache_bytes": max(stage1, turns, fork),
            "rollout_bytes": max(stage1 + stage1_temps, turns + turn_temps, fork),
            "activation_bytes": activation_bytes(shape, slots, size, policy)}


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
