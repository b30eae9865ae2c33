"""The compiled step scores the distribution it sampled from, at any temperature; a process builds each step once."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from toy import TINY_POLICY, tiny_env, trained_policy_state
from trace_jax.allocation import Allocator, Plan
from trace_jax.envs.hopworld import protocol
from trace_jax.evaluate import question_pool
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.sharding import init_policy
from trace_jax.train.step import StepSpec, TrainState, build_step, build_update, make_optimizer
from trace_jax.train.steps import make_step

PLAN = Plan(Allocator("trace"), roots=8, continuations=2)


def test_first_update_is_exactly_on_policy(temperature=0.7, top_p=0.9):
    """A trained (peaked) policy, so a mis-scored distribution shows: every policy token's ratio is 1."""
    graphdef, params = trained_policy_state()
    params = jax.tree.map(jnp.copy, params)
    tx = make_optimizer(1e-3, 1.0)
    state = TrainState(params=params, opt_state=tx.init(params), ref_params=jax.tree.map(jnp.copy, params),
                       step=jnp.zeros((), jnp.int32))
    spec = StepSpec(plan=PLAN, sampling=SamplingConfig(temperature, top_p), clip_eps=0.2, kl_coef=0.1,
                    predictor_coef=1.0, pad_id=protocol.PAD)
    env = tiny_env()
    _, metrics = build_step(graphdef, tx, spec)(state, env, question_pool(env, np.arange(4)), jax.random.key(0))
    assert float(metrics["ratio_max_dev"]) < 1e-5
    assert float(metrics["clip_frac"]) == 0.0 and abs(float(metrics["kl_ref"])) < 1e-6


def test_a_process_builds_each_step_once():
    """Equal settings give the step already built (a comparison's later runs trace nothing again); any differing
    setting, a new one."""
    graphdef, other_load = (nnx.split(init_policy(TINY_POLICY, seed))[0] for seed in (0, 1))
    spec = StepSpec(plan=PLAN, sampling=SamplingConfig(0.7), clip_eps=0.2, kl_coef=0.0, predictor_coef=1.0,
                    pad_id=protocol.PAD)
    tx = make_optimizer(1e-3, 1.0)
    assert make_optimizer(1e-3, 1.0) is tx and make_optimizer(2e-3, 1.0) is not tx
    step = make_step(graphdef, tx, spec)
    assert make_step(other_load, make_optimizer(1e-3, 1.0), StepSpec(**vars(spec))) is step
    assert make_step(graphdef, make_optimizer(2e-3, 1.0), spec) is not step
    assert make_step(graphdef, tx, StepSpec(**{**vars(spec), "kl_coef": 0.1})) is not step
    assert build_update(other_load, tx, spec) is build_update(graphdef, tx, spec)


def test_a_mixed_precision_step_keeps_float32_state_and_scores_what_it_sampled():
    """bfloat16 compute over float32 parameters (`sft.model.dtype`, `search_qa.dtype`): the update moves the
    parameters and they and Adam's moments stay float32; the trainer's bfloat16 forward scores the sampled tokens
    as the sampler did (on this tiny policy the two round alike: ratios measured within 1e-6 of 1; on larger
    ones they differ by bfloat16's rounding, README "Precision")."""
    _, params = trained_policy_state()
    graphdef = nnx.split(init_policy(dataclasses.replace(TINY_POLICY, dtype="bfloat16"), 0))[0]
    tx = make_optimizer(1e-3, 1.0)
    state = TrainState(params=jax.tree.map(jnp.copy, params), opt_state=tx.init(params), ref_params=None,
                       step=jnp.zeros((), jnp.int32))
    spec = StepSpec(plan=PLAN, sampling=SamplingConfig(0.7), clip_eps=0.2, kl_coef=0.0, predictor_coef=1.0,
                    pad_id=protocol.PAD)
    env = tiny_env()
    new, metrics = build_step(graphdef, tx, spec)(state, env, question_pool(env, np.arange(4)), jax.random.key(0))
    assert float(metrics["ratio_max_dev"]) < 1e-3 and np.isfinite(float(metrics["loss"]))
    floats = [x for x in jax.tree.leaves((new.params, new.opt_state)) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert {x.dtype for x in floats} == {jnp.dtype(jnp.float32)}
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new.params))]
    assert sum(moved) > len(moved) // 2
