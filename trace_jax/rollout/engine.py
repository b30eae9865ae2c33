"""The jitted multi-turn rollout loop: prefill, then turn by turn decode -> env step -> observation.

Turns are synchronous across slots: every live slot generates its turn (until a stop token or
A tokens), the environment answers all of them at once, and the observations enter the KV cache
in one chunked forward. Slots whose episode ended sit idle (their writes are dropped).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from trace_jax.envs.base import JaxEnv
from trace_jax.models.cache import KVCache
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.sampling import sample_tokens
from trace_jax.rollout.tree import Tree, roots


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rollout:
    """Everything a slot needs to continue: its arrays, KV cache, next-token logits, env state."""

    tree: Tree
    cache: KVCache
    logits: jax.Array  # [S, V] next-token logits
    env_state: Any  # per-slot env state, leading axis S
    keys: jax.Array  # [S] PRNG key per slot; token at position p uses fold_in(key, p)


def _write(buf: jax.Array, pos: jax.Array, values: jax.Array) -> jax.Array:
    """buf [S, L]; write values [S, W] at positions pos [S, W] (positions >= L are dropped)."""
    rows = jnp.arange(buf.shape[0])[:, None]
    return buf.at[rows, pos].set(values, mode="drop")


def start(model: Policy, env: JaxEnv, tree: Tree, keys: jax.Array, prompt_width: int) -> Rollout:
    """Prefill every slot's prompt (the first `prompt_width` columns) and reset its environment."""
    cache = KVCache.init(model.cfg, tree.num_slots, tree.max_len)
    out = model(tree.tokens[:, :prompt_width], cache=cache, num_valid=tree.prompt_len)
    last = (tree.prompt_len - 1)[:, None]
    logits = jnp.take_along_axis(out.logits, last[:, :, None], axis=1)[:, 0]
    success0 = jnp.take_along_axis(out.success, last, axis=1)[:, 0]
    tree = dataclasses.replace(tree, success=tree.success.at[:, 0].set(success0),
                               model_tokens=tree.model_tokens + tree.prompt_len)
    return Rollout(tree=tree, cache=out.cache, logits=logits, env_state=env.reset(tree.question),
                   keys=keys)


def _generate_turn(model: Policy, env: JaxEnv, ro: Rollout, sampling: SamplingConfig
                   ) -> tuple[Rollout, jax.Array, jax.Array]:
    """Decode one turn for every live slot. Returns (rollout, action [S, A], action_len [S])."""
    s, stop_ids = ro.tree.num_slots, jnp.asarray(env.stop_ids)
    live = ~ro.tree.done

    def cond(carry):
        k, _, active, _, _ = carry
        return (k < env.action_len) & active.any()

    def body(carry):
        k, ro, active, action, action_len = carry
        tree = ro.tree
        keys = jax.vmap(jax.random.fold_in)(ro.keys, tree.length)
        tok, logp = sample_tokens(ro.logits, keys, sampling.temperature, sampling.top_p)
        pos = jnp.where(active, tree.length, tree.max_len)[:, None]
        out = model(tok[:, None], cache=ro.cache, num_valid=active.astype(jnp.int32))
        tree = dataclasses.replace(
            tree,
            tokens=_write(tree.tokens, pos, tok[:, None]),
            policy_mask=_write(tree.policy_mask, pos, jnp.ones((s, 1), bool)),
            logprobs=_write(tree.logprobs, pos, logp[:, None]),
            length=tree.length + active,
            model_tokens=tree.model_tokens + active,
        )
        action = action.at[:, k].set(jnp.where(active, tok, 0))
        logits = jnp.where(active[:, None], out.logits[:, 0], ro.logits)
        ro = dataclasses.replace(ro, tree=tree, cache=out.cache, logits=logits)
        return k + 1, ro, active & ~jnp.isin(tok, stop_ids), action, action_len + active

    init = (jnp.int32(0), ro, live, jnp.zeros((s, env.action_len), jnp.int32), jnp.zeros((s,), jnp.int32))
    _, ro, _, action, action_len = jax.lax.while_loop(cond, body, init)
    return ro, action, action_len


def _observe(model: Policy, env: JaxEnv, ro: Rollout, turn: jax.Array, action: jax.Array,
             action_len: jax.Array) -> Rollout:
    """Step the environment for live slots and feed their observations through the model."""
    tree = ro.tree
    live = ~tree.done
    env_state, obs, obs_len, reward, done = env.step(ro.env_state, action, action_len)
    env_state = jax.tree.map(lambda new, old: jnp.where(
        live.reshape((-1,) + (1,) * (new.ndim - 1)), new, old), env_state, ro.env_state)
    obs_len = jnp.where(live, obs_len, 0)
    pos = jnp.where(jnp.arange(env.obs_len) < obs_len[:, None], tree.length[:, None] + jnp.arange(env.obs_len),
                    tree.max_len)
    out = model(obs, cache=ro.cache, num_valid=obs_len)
    last = jnp.maximum(obs_len - 1, 0)[:, None]
    has_obs = obs_len > 0
    logits = jnp.where(has_obs[:, None], jnp.take_along_axis(out.logits, last[:, :, None], axis=1)[:, 0],
                       ro.logits)
    reading = jnp.take_along_axis(out.success, last, axis=1)[:, 0]
    length = tree.length + obs_len
    tree = dataclasses.replace(
        tree,
        tokens=_write(tree.tokens, pos, obs),
        length=length,
        boundaries=tree.boundaries.at[:, turn].set(jnp.where(live, length, -1)),
        success=tree.success.at[:, turn + 1].set(jnp.where(has_obs, reading, tree.success[:, turn + 1])),
        num_turns=tree.num_turns + live,
        done=tree.done | (live & done),
        reward=jnp.where(live & done, reward, tree.reward),
        model_tokens=tree.model_tokens + obs_len,
    )
    return dataclasses.replace(ro, tree=tree, cache=out.cache, logits=logits, env_state=env_state)


def run_turns(model: Policy, env: JaxEnv, ro: Rollout, sampling: SamplingConfig) -> Rollout:
    """Roll every live slot to the end of its episode (at most env.max_turns turns)."""

    def turn_body(turn, ro):
        def play(ro):
            ro, action, action_len = _generate_turn(model, env, ro, sampling)
            return _observe(model, env, ro, turn, action, action_len)

        return jax.lax.cond((~ro.tree.done).any(), play, lambda ro: ro, ro)

    return jax.lax.fori_loop(0, env.max_turns, turn_body, ro)


def max_len(prompt_width: int, env: JaxEnv) -> int:
    """Slot length that fits a prompt and env.max_turns full turns with observations."""
    return prompt_width + env.max_turns * (env.action_len + env.obs_len)


@functools.partial(jax.jit, static_argnames=("graphdef", "sampling", "pad_id"))
def _rollout(graphdef, state, env, prompt_ids, prompt_len, question, key, sampling, pad_id) -> Tree:
    model = nnx.merge(graphdef, state)
    s = prompt_ids.shape[0]
    tree = roots(prompt_ids, prompt_len, jnp.arange(s), question, max_len(prompt_ids.shape[1], env),
                 env.max_turns, pad_id)
    ro = start(model, env, tree, jax.random.split(key, s), prompt_ids.shape[1])
    return run_turns(model, env, ro, sampling).tree


def rollout_prompts(model: Policy, env: JaxEnv, prompt_ids: jax.Array, prompt_len: jax.Array,
                    question: jax.Array, key: jax.Array, sampling: SamplingConfig, pad_id: int) -> Tree:
    """One episode per prompt row (no branching): prompt_ids [S, P] right-padded -> finished Tree."""
    graphdef, state = nnx.split(model)
    return _rollout(graphdef, state, env, jnp.asarray(prompt_ids), jnp.asarray(prompt_len, jnp.int32),
                    jnp.asarray(question, jnp.int32), key, sampling, pad_id)
