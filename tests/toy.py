"""Shared test toys: one tiny Qwen3 policy config, one tiny HopWorld, a briefly trained policy, one tree factory."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from trace_jax.config import SFTConfig
from trace_jax.envs.hopworld import HopWorldConfig, build_world
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.envs.hopworld.vocab import VOCAB_SIZE
from trace_jax.models import ModelConfig, Policy
from trace_jax.rollout.tree import Tree

TINY_POLICY = ModelConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=16, rope_theta=1e4)
TINY_WORLD = HopWorldConfig(seed=2, num_entities=64, num_questions=40, max_turns=5)


def tiny_env(cfg: HopWorldConfig = TINY_WORLD) -> HopWorldEnv:
    return HopWorldEnv(build_world(cfg), cfg)


@functools.lru_cache(maxsize=2)
def trained_policy_state(steps: int = 120):
    """(graphdef, params) of TINY_POLICY after `steps` SFT steps on TINY_WORLD expert episodes. At 120: peaked, not
    near-uniform, next-token distributions (so small numerical errors show), but it wins few episodes (~3%); at
    400 it wins ~40% of them (mixed outcomes). Trained once per test session and step count: the first worker saves
    the parameters in the session's shared folder (tests/conftest.py), the others load them."""
    from built_once import built_once
    from flax import nnx

    from trace_jax.sharding import init_policy

    model = init_policy(TINY_POLICY, seed=0)
    if "TRACE_JAX_TEST_SHARED" not in os.environ:  # outside a test session
        _train(model, steps)
        return nnx.split(model)

    def train_and_save(folder: Path) -> None:
        _train(model, steps)
        np.savez(folder / "params.npz", *(np.asarray(x) for x in jax.tree.leaves(nnx.state(model))))

    shared = Path(os.environ["TRACE_JAX_TEST_SHARED"])
    saved = built_once(shared, f"trained_policy_{steps}", train_and_save) / "params.npz"
    graphdef, params = nnx.split(model)
    with np.load(saved) as leaves:
        return graphdef, jax.tree.unflatten(jax.tree.structure(params), [jnp.asarray(leaves[f"arr_{i}"])
                                                                      for i in range(len(leaves.files))])


def run_fast(step):
    """`step` (an `nnx.jit` training step: step(model, optimizer, *arrays) updates both in place and returns its
    output) compiled for running at `xla_flags.RUN_FAST`: for a fixture's fine-tuning loop, which runs one program
    many times."""
    from flax import nnx
    from xla_flags import RUN_FAST

    compiled = {}

    def call(model, optimizer, *arrays):
        graphdef, state = nnx.split((model, optimizer))
        if graphdef not in compiled:
            def pure(state, *arrays):
                model, optimizer = nnx.merge(graphdef, state)
                out = step.fun(model, optimizer, *arrays)
                return nnx.state((model, optimizer)), out

            compiled[graphdef] = jax.jit(pure, donate_argnums=0, compiler_options=RUN_FAST)
        state, out = compiled[graphdef](state, *arrays)
        nnx.update((model, optimizer), state)
        return out

    return call


@contextlib.contextmanager
def fast_fitting() -> Iterator[None]:
    """The tiny kits' fine-tuning (`search_qa_tiny.fit_episodes`: the search QA, math and BFCL kits) compiled for
    running (`run_fast`): their hundreds of steps are most of a kit's time."""
    import pytest

    from trace_jax.data import search_qa_tiny

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search_qa_tiny, "sft_step", run_fast(search_qa_tiny.sft_step))
        yield


def _train(model: Policy, steps: int) -> None:
    """`steps` SFT steps of `model` on TINY_WORLD's expert episodes (in place)."""
    from trace_jax.sft import expert_data, make_optimizer, train_step

    cfg = dataclasses.replace(SFTConfig(), world=TINY_WORLD, model=TINY_POLICY, steps=steps, batch_size=16,
                              learning_rate=3e-3, warmup_steps=10, episodes=256)
    tokens, mask, _ = expert_data(cfg, tiny_env(), np.arange(TINY_WORLD.num_questions))
    optimizer = make_optimizer(model, cfg)
    train_step = run_fast(train_step)
    rng = np.random.default_rng(0)
    for _ in range(cfg.steps):
        rows = rng.choice(len(tokens), cfg.batch_size, replace=False)
        train_step(model, optimizer, jnp.asarray(tokens[rows]), jnp.asarray(mask[rows]))


def trained_policy() -> Policy:
    from flax import nnx

    graphdef, params = trained_policy_state()
    return nnx.merge(graphdef, params)


def make_tree(prompt, num_turns, reward, parent=None, branch_turn=None, success=None, turns: int = 3,
              width: int = 4) -> Tree:
    """Slot arrays for allocation and objectives tests: slot s played num_turns[s] turns (boundaries
    10, 20, ...), readings at node indices <= num_turns (0.5 unless given), roots unless parent given."""
    prompt, num_turns = np.asarray(prompt, np.int32), np.asarray(num_turns, np.int32)
    s = len(prompt)
    none = np.full(s, Tree.NO_PARENT, np.int32)
    if success is None:
        success = np.where(np.arange(turns + 1) <= num_turns[:, None], 0.5, Tree.NO_READING)
    boundaries = np.where(np.arange(turns) < num_turns[:, None], 10 * (np.arange(turns) + 1), Tree.NO_TURN)
    empty = Tree.empty(s, width, turns, pad_id=0)
    return dataclasses.replace(
        empty, boundaries=jnp.asarray(boundaries, jnp.int32), success=jnp.asarray(success, jnp.float32),
        num_turns=jnp.asarray(num_turns), prompt=jnp.asarray(prompt),
        parent=jnp.asarray(none if parent is None else parent, jnp.int32),
        branch_turn=jnp.asarray(none if branch_turn is None else branch_turn, jnp.int32),
        reward=jnp.asarray(reward, jnp.float32))
