"""A decode step reads the weights where they lie: XLA:CPU copies or transposes no weight matrix at a step (a copy
of every layer's output projection cost 2-3% of a 134M decode step, docs/measurements/sampler.md), nor anywhere in
a compiled turn (the prompts' prefill, the decode loop, the observation's forward)."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trace_jax.models.cache import KVCache
from trace_jax.models.config import ModelConfig
from trace_jax.models.decode import decode_step
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import Policy, matmul
from trace_jax.rollout import expand as ex
from trace_jax.rollout.engine import SamplingConfig, TurnSpec, append_observation, generate_turn

# sizes chosen so that no activation of a 3-row step over 11 cache positions has as many elements as a weight matrix
CFG = ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16, rope_theta=1e4, tie_word_embeddings=True)
ROWS, LENGTH = 3, 11


def _moved_sizes(hlo: str, per_step: bool = False) -> set[int]:
    """The element counts of every float array a copy or transpose in the compiled module makes; per_step: only those
    a loop's body runs (not the entry computation's, which run once a call, as one hoisted out of the loop)."""
    computation, entry, caller, found = "", "", {}, []  # caller: computation -> the computation that calls it
    for line in hlo.splitlines():
        if line.startswith("ENTRY "):
            computation = entry = line.split(" ")[1].lstrip("%")
        elif line and not line.startswith(" "):
            computation = line.split(" ")[0].lstrip("%")
        for called in re.findall(r"(?:calls|body|condition|to_apply)=%([\w.\-]+)", line):
            caller[called] = computation
        shape = re.search(r"= (?:f32|bf16)\[([\d,]*)\]\S* (?:copy|transpose)\(", line)
        if shape:
            found.append((computation, int(np.prod([int(d) for d in shape.group(1).split(",") if d]))))

    def once(computation: str) -> bool:  # the entry computation, or a fusion it calls directly
        return entry in (computation, caller.get(computation))

    return {size for computation, size in found if not (per_step and once(computation))}


def _model(tied: bool, dtype: str) -> tuple[Policy, set[int]]:
    """(the policy, the element counts of its weight matrices)."""
    cfg = dataclasses.replace(CFG, tie_word_embeddings=tied, dtype=dtype, param_dtype=dtype)
    model = Policy(cfg, nnx.Rngs(0))
    return model, {int(np.prod(p.shape)) for p in jax.tree.leaves(nnx.state(model, nnx.Param)) if p.ndim >= 2}


@dataclasses.dataclass(frozen=True)
class _Env:
    """No environment: the shape of a turn and its questions' starting state, nothing else."""

    action_len: int = 4
    obs_len: int = 2
    max_turns: int = 1
    stop_ids: tuple[int, ...] = (5,)

    def reset(self, question: jax.Array) -> jax.Array:
        return question


CASES = [(True, "float32"), (False, "float32"), (True, "bfloat16")]


@pytest.mark.parametrize("tied, dtype", CASES)
def test_a_decode_step_copies_no_weight(tied, dtype):
    model, weights = _model(tied, dtype)
    cfg = model.cfg
    cache = KVCache.init(cfg, ROWS, LENGTH)
    hlo = jit_with_model(decode_step).lower(model, jnp.zeros((ROWS,), jnp.int32), cache).compile().as_text()
    assert not _moved_sizes(hlo) & weights
    # the output projection contracted over heads and head_dim as two axes is copied here, so the check can fail
    o_proj = list(model.layers)[0].self_attn.o_proj[...]
    out = jnp.zeros((ROWS, 1, cfg.num_heads, cfg.head_dim), cfg.jnp_dtype)
    two_axes = jax.jit(lambda o, w: matmul("btnh,nhd->btd", o, w)).lower(out, o_proj).compile().as_text()
    assert o_proj.size in _moved_sizes(two_axes)


@pytest.mark.parametrize("tied, dtype", CASES)
def test_a_turn_copies_no_weight(tied, dtype):
    """The prompts' prefill and the roots' start, a turn's decode loop (3 prompt tokens and 4 drawn, at top-p) and
    its observation's forward (2 tokens), each compiled as the engine runs them."""
    model, weights = _model(tied, dtype)
    pool = ex.Pool(tokens=jnp.ones((ROWS, 3), jnp.int32), lengths=jnp.full((ROWS,), 3, jnp.int32),
                   question=jnp.zeros((ROWS,), jnp.int32))
    spec = TurnSpec.of(_Env())

    def start(m, pool):
        return ex.start_roots(m, _Env(), pool, ex.prefill_pool(m, pool), jnp.arange(ROWS, dtype=jnp.int32),
                              jax.random.split(jax.random.key(0), ROWS), pad_id=0, slot_len=LENGTH)

    def turn(m, ro):
        return generate_turn(m, ro, spec=spec, sampling=SamplingConfig(temperature=0.7, top_p=0.9))[0]

    def observe(m, ro):
        zeros = jnp.zeros((ROWS,), bool)
        return append_observation(m, ro, jnp.ones((ROWS, 2), jnp.int32), jnp.full((ROWS,), 2, jnp.int32),
                                  zeros.astype(jnp.float32), zeros)

    ro = jax.eval_shape(lambda: start(model, pool))
    for fn, args in ((start, (pool,)), (observe, (ro,))):
        hlo = jit_with_model(fn).lower(model, *args).compile().as_text()
        assert not _moved_sizes(hlo) & weights, fn.__name__
    # in bfloat16 the tied head is transposed once a turn, ahead of the loop: no step copies a weight
    hlo = jit_with_model(turn).lower(model, ro).compile().as_text()
    assert not _moved_sizes(hlo, per_step=True) & weights
