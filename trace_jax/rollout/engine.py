"""The multi-turn rollout loop: turn by turn, decode -> environment -> observation into the cache.

Turns are synchronous across slots: every live slot generates its next turn (until a stop token
or A tokens), the environment answers all of them at once, and the observations enter the KV
cache in one chunked forward. Slots may be at different turn indices (forked continuations start
mid-episode). Finished and unused slots sit idle; their writes are dropped.

Two ways to drive it: `run_turns` keeps the whole loop inside `jit` for JAX-native environments;
for host-side tools, `generate_turn` and `append_observation` are compiled once and the host
computes observations in between (`run_turns_host`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from trace_jax.envs.base import HostEnv, JaxEnv
from trace_jax.models.cache import KVCache
from trace_jax.models.decode import at_rows, write_at_rows
from trace_jax.models.jit import jit_with_model
from trace_jax.models.qwen3 import ModelOutput, Policy
from trace_jax.rollout.sampling import DRAWS, sample_tokens
from trace_jax.rollout.tree import Tree
from trace_jax.sharding import constrain_rows, from_process_rows, process_rows, to_host, to_process_rows


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """temperature (0: greedy), top_p (1: off) and the draw (`sampling.DRAWS`: gumbel, inverse_cdf)."""

    temperature: float = 1.0
    top_p: float = 1.0
    draw: str = "gumbel"

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.draw not in DRAWS:
            raise ValueError(f"sampling.draw={self.draw!r}: use one of {DRAWS}")


@dataclasses.dataclass(frozen=True)
class TurnSpec:
    """Static shape of a turn: policy tokens per turn, observation tokens, turns, stop tokens.

    A turn ends after a token in `stop_ids`, or after the tokens of any of `stop_sequences` (for tags a
    tokenizer splits into several tokens, such as `</search>`), or at action_len tokens.
    """

    action_len: int
    obs_len: int
    max_turns: int
    stop_ids: tuple[int, ...]
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if any(not seq for seq in self.stop_sequences):
            raise ValueError("stop_sequences must not contain an empty sequence")

    @classmethod
    def of(cls, env: JaxEnv | HostEnv) -> TurnSpec:
        sequences = tuple(tuple(s) for s in getattr(env, "stop_sequences", ()))
        return cls(env.action_len, env.obs_len, env.max_turns, tuple(env.stop_ids), sequences)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rollout:
    """Everything a slot needs to continue: its arrays, KV cache, next-token logits, env state."""

    tree: Tree
    cache: KVCache
    logits: jax.Array  # [S, V] next-token logits
    boundary_hidden: jax.Array  # [S, T, D] final hidden state at the end of each turn (fork logits)
    env_state: Any  # per-slot env state, leading axis S
    keys: jax.Array  # [S] PRNG key per slot; the token at position p uses fold_in(key, p)
    decode_steps: jax.Array  # [] int32 decode loop iterations so far
    live_tokens: jax.Array  # [] int32 tokens those iterations generated (utilisation = live / (S x steps))
    fed_positions: jax.Array  # [] int32 rows x positions of every forward since the prefill, padding included

    @property
    def pending(self) -> jax.Array:
        """[S] whether the slot's last token is not yet in its cache: a turn leaves its last token to the
        observation's forward (`generate_turn`), so the cache is one position behind the tree until then."""
        return self.tree.length > self.cache.lengths

    @property
    def pending_token(self) -> jax.Array:
        """[S] int32 the token at each slot's cache length: its pending token where it has one."""
        return at_rows(self.tree.tokens, jnp.minimum(self.cache.lengths, self.tree.max_len - 1))


def forward(model: Policy, ro: Rollout, ids: jax.Array, num_valid: jax.Array) -> tuple[ModelOutput, jax.Array]:
    """The engine's only model call on a rollout: ids [S, W] into the cache at each slot's position.
    Returns (output, fed_positions + S * W): what the model was fed, counted from the input itself."""
    return model(ids, cache=ro.cache, num_valid=num_valid), ro.fed_positions + ids.size


def rows_where(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per-row select over pytrees whose leaves lead with the slot axis."""
    return jax.tree.map(lambda a, b: jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)


def forward_pending(model: Policy, ro: Rollout, ids: jax.Array, num_valid: jax.Array
                    ) -> tuple[ModelOutput, jax.Array, jax.Array]:
    """`forward` of each slot's pending token (`Rollout.pending`), then its ids [S, W] (num_valid [S] real):
    (output [S, W + 1], fed_positions, fed [S] the positions each slot fed)."""
    pending = ro.pending
    chunk = jnp.where(pending[:, None], jnp.concatenate([ro.pending_token[:, None], ids], axis=1),
                      jnp.pad(ids, ((0, 0), (0, 1))))  # [S, W + 1] the pending token first, where there is one
    fed = pending + num_valid
    return *forward(model, ro, chunk, fed), fed


def feed_pending(model: Policy, ro: Rollout) -> Rollout:
    """Each slot's sampled token not yet in its cache (`Rollout.pending`) through the model: one decode step, the
    slots' next logits from it."""
    s = ro.tree.num_slots
    out, fed_positions, fed = forward_pending(model, ro, jnp.zeros((s, 0), jnp.int32), jnp.zeros((s,), jnp.int32))
    return dataclasses.replace(ro, cache=out.cache, logits=jnp.where(fed[:, None] > 0, out.logits[:, 0], ro.logits),
                               fed_positions=fed_positions)


def generate_turn(model: Policy, ro: Rollout, *, spec: TurnSpec, sampling: SamplingConfig
                  ) -> tuple[Rollout, jax.Array, jax.Array]:
    """Decode one turn for every live slot (until a stop, see `TurnSpec`). Returns (rollout, action [S, A],
    action_len [S]).

    A draw takes each slot's next logits; a decode step feeds the drawn token to get the next ones. The turn's last
    token is left out of the cache (`Rollout.pending`): the observation's forward feeds it (`append_observation`),
    so a turn of k tokens costs k - 1 decode steps, as transformers' `generate` of k new tokens does. `ro` holds
    every token in its cache (`start_roots`, `fork`, `append_observation` leave it so)."""
    s, stop_ids = ro.tree.num_slots, jnp.asarray(spec.stop_ids)
    window = max((len(q) for q in spec.stop_sequences), default=1)

    def stops(tok: jax.Array, recent: jax.Array) -> jax.Array:
        """[S] whether this turn ends with tok, given its last `window` tokens recent [S, window]."""
        stop = jnp.isin(tok, stop_ids)
        for seq in spec.stop_sequences:
            stop |= (recent[:, window - len(seq):] == jnp.asarray(seq, jnp.int32)).all(1)
        return stop

    def draw(carry, steps: jax.Array):
        """The active slots' k-th token of the turn, drawn from their next logits and written to the tree; `steps`
        (0 or 1) added to the decode loop's iterations."""
        k, ro, active, action, action_len, recent = carry
        tree = ro.tree
        keys = jax.vmap(jax.random.fold_in)(ro.keys, tree.length)
        tok, logp = sample_tokens(ro.logits, keys, sampling.temperature, sampling.top_p, sampling.draw)
        pos = jnp.where(active, tree.length, tree.max_len)[:, None]
        tree = dataclasses.replace(
            tree,
            tokens=write_at_rows(tree.tokens, pos, tok[:, None]),
            policy_mask=write_at_rows(tree.policy_mask, pos, jnp.ones((s, 1), bool)),
            logprobs=write_at_rows(tree.logprobs, pos, logp[:, None]),
            length=tree.length + active,
            model_tokens=tree.model_tokens + active,
        )
        action = action.at[:, k].set(jnp.where(active, tok, 0))
        ro = dataclasses.replace(ro, tree=tree, decode_steps=ro.decode_steps + steps)
        recent = jnp.concatenate([recent[:, 1:], tok[:, None]], axis=1)
        return k + 1, ro, active & ~stops(tok, recent), action, action_len + active, recent

    def cond(carry):
        k, _, active, _, _, _ = carry
        return (k < spec.action_len) & active.any()

    def body(carry):
        k, ro, *rest = carry
        return draw((k, feed_pending(model, ro), *rest), jnp.int32(1))  # `cond` found a slot active

    live = ~ro.tree.done
    init = (jnp.int32(0), ro, live, jnp.zeros((s, spec.action_len), jnp.int32),
            jnp.zeros((s,), jnp.int32), jnp.full((s, window), -1, jnp.int32))  # -1: no token yet this turn
    first = draw(init, live.any().astype(jnp.int32))  # a turn's first token needs no decode step
    _, ro, _, action, action_len, _ = jax.lax.while_loop(cond, body, first)
    # the turn's tokens summed once, not at every step: on a mesh splitting the slots, a sum across the devices
    return dataclasses.replace(ro, live_tokens=ro.live_tokens + action_len.sum()), action, action_len


def append_observation(model: Policy, ro: Rollout, obs: jax.Array, obs_len: jax.Array,
                       reward: jax.Array, done: jax.Array, env_state: Any = None) -> Rollout:
    """Close the current turn of every live slot with its observation obs [S, O] (obs_len [S]).

    The turn's last token (`Rollout.pending`) and the observation go through the model in one chunked forward;
    the turn boundary, the V~ reading and the final hidden state at its end are recorded. `done`/`reward` [S] end
    episodes.
    """
    tree = ro.tree
    live = ~tree.done
    obs_len = jnp.where(live, obs_len, 0).astype(jnp.int32)
    width = obs.shape[1]
    pos = jnp.where(jnp.arange(width) < obs_len[:, None], tree.length[:, None] + jnp.arange(width),
                    tree.max_len)
    out, fed_positions, fed = forward_pending(model, ro, obs, obs_len)  # [S, O + 1]
    last = jnp.maximum(fed - 1, 0)  # the last observation token, or the pending one where there is none
    hidden = at_rows(out.hidden, last)  # [S, D]
    has_obs = obs_len > 0
    # the head at each slot's last fed token only (the chunk's other logits are dead code)
    logits = jnp.where((fed > 0)[:, None], model.logits_from_hidden(hidden), ro.logits)
    reading = at_rows(out.success, last)
    turn = jnp.where(live, tree.num_turns, tree.max_turns)  # out of range -> dropped
    length = tree.length + obs_len
    tree = dataclasses.replace(
        tree,
        tokens=write_at_rows(tree.tokens, pos, obs),
        length=length,
        boundaries=write_at_rows(tree.boundaries, turn, length),
        success=write_at_rows(tree.success, jnp.where(has_obs, turn + 1, tree.success.shape[1]), reading),
        num_turns=tree.num_turns + live,
        done=tree.done | (live & done),
        reward=jnp.where(live & done, reward, tree.reward),
        model_tokens=tree.model_tokens + obs_len,
    )
    boundary_hidden = write_at_rows(ro.boundary_hidden, jnp.where(has_obs, turn, ro.boundary_hidden.shape[1]),
                             hidden.astype(ro.boundary_hidden.dtype))
    env_state = ro.env_state if env_state is None else rows_where(live, env_state, ro.env_state)
    return dataclasses.replace(ro, tree=tree, cache=out.cache, logits=logits,
                               boundary_hidden=boundary_hidden, env_state=env_state, fed_positions=fed_positions)


def play_turn(model: Policy, env: JaxEnv, ro: Rollout, *, sampling: SamplingConfig) -> Rollout:
    """One turn of every live slot: generate, the environment's step, the observation into the cache."""
    ro, action, action_len = generate_turn(model, ro, spec=TurnSpec.of(env), sampling=sampling)
    env_state, obs, obs_len, reward, done = env.step(ro.env_state, action, action_len)
    return append_observation(model, ro, obs, obs_len, reward, done, env_state)


def run_turns(model: Policy, env: JaxEnv, ro: Rollout, *, sampling: SamplingConfig) -> Rollout:
    """Roll every live slot to the end of its episode, all inside the trace (JAX-native env)."""
    def turn_body(_, ro):
        return jax.lax.cond((~ro.tree.done).any(), lambda ro: play_turn(model, env, ro, sampling=sampling),
                            lambda ro: ro, ro)

    return jax.lax.fori_loop(0, env.max_turns, turn_body, ro)


def _generate_rows(model: Policy, ro: Rollout, *, spec: TurnSpec, sampling: SamplingConfig, mesh: Mesh | None
                   ) -> tuple[Rollout, jax.Array, jax.Array]:
    """`generate_turn` with its slots (in and out) split over the mesh's data axes."""
    return constrain_rows(generate_turn(model, constrain_rows(ro, mesh), spec=spec, sampling=sampling), mesh)


def _append_rows(model: Policy, ro: Rollout, obs: jax.Array, obs_len: jax.Array, reward: jax.Array,
                 done: jax.Array, *, mesh: Mesh | None) -> Rollout:
    """`append_observation` with its slots (in and out) split over the mesh's data axes."""
    obs, obs_len, reward, done = constrain_rows((obs, obs_len, reward, done), mesh)
    return constrain_rows(append_observation(model, constrain_rows(ro, mesh), obs, obs_len, reward, done), mesh)


# the rollout argument is donated: a host loop replaces it with the result every turn
generate_turn_jit = jit_with_model(_generate_rows, static_argnames=("spec", "sampling", "mesh"), donate_first=True)
append_observation_jit = jit_with_model(_append_rows, static_argnames=("mesh",), donate_first=True)


def host_turn_fns(model: Policy, spec: TurnSpec, sampling: SamplingConfig, mesh: Mesh | None = None):
    """(generate, append) for `run_turns_host`: `generate_turn` and `append_observation` over this
    model (split once), compiled once per (model graph, shapes, spec, sampling, mesh) and called from Python;
    mesh: each turn's slots are split over its data axes."""
    return (functools.partial(generate_turn_jit.bind(model), spec=spec, sampling=sampling, mesh=mesh),
            functools.partial(append_observation_jit.bind(model), mesh=mesh))


def past_actions(tokens: np.ndarray, policy_mask: np.ndarray, prompt_len: np.ndarray, boundaries: np.ndarray,
                 num_turns: np.ndarray, live: np.ndarray) -> list[list[np.ndarray]]:
    """Per row, the action token ids of each turn its episode took so far: a list (one per row) of num_turns int32
    arrays [A_t]; [] for rows not live. Turn t spans (boundaries[t - 1], or prompt_len for t = 0, up to
    boundaries[t]): its action is that span's policy tokens, its observation the rest. A continuation holds a copy
    of its parent's prefix, so its first turns are the parent's.

    tokens, policy_mask [R, L]; prompt_len, num_turns, live [R]; boundaries [R, T] (this process's rows)."""
    out: list[list[np.ndarray]] = []
    for r in range(len(tokens)):
        ends = boundaries[r, : num_turns[r]] if live[r] else boundaries[r, :0]  # [t]
        starts = np.concatenate([prompt_len[r : r + 1], ends[:-1]])  # [t]
        out.append([tokens[r, a:b][policy_mask[r, a:b]].astype(np.int32) for a, b in zip(starts, ends)])
    return out


def play_turn_host(generate: Callable[[Rollout], tuple[Rollout, jax.Array, jax.Array]],
                   append: Callable[[Rollout, Any, Any, Any, Any], Rollout], env: HostEnv, ro: Rollout) -> Rollout:
    """One turn of every live slot with the environment on the host: one `env.step` for the live slots.

    generate / append: `generate_turn` / `append_observation` closed over model, spec and sampling,
    each jitted once by the caller (`host_turn_fns`). With several processes (slots split over their
    devices) each process's environment answers only its own rows and the observations are assembled
    as global arrays (actions are read from the process's own shards). A stateful env (`env.stateful`) is
    also handed each row's earlier actions (`past_actions`, read from the tree before the turn), from which
    it restores the episode's state, a fork's included; a stateless one reads nothing more.
    """
    rows = process_rows(ro.tree.done.sharding, ro.tree.done.shape)  # every row in one process
    by_row, by_row_2d = ro.tree.done.sharding, ro.tree.tokens.sharding

    def put(x: np.ndarray, dtype) -> jax.Array:  # this process's rows -> the global [S, ...] array
        return from_process_rows(np.asarray(x, dtype), rows, ro.tree.num_slots, by_row if x.ndim == 1 else by_row_2d)

    live = ~to_process_rows(ro.tree.done, rows)
    question, turn = to_process_rows(ro.tree.question, rows), to_process_rows(ro.tree.num_turns, rows)
    history = {}
    if getattr(env, "stateful", False):  # read before `generate`, which takes (donates) the rollout
        t = ro.tree
        history["past_actions"] = past_actions(*(to_process_rows(x, rows) for x in (
            t.tokens, t.policy_mask, t.prompt_len, t.boundaries, t.num_turns)), live)
    ro, action, action_len = generate(ro)
    obs, obs_len, reward, done = env.step(question, turn, live, to_process_rows(action, rows),
                                          to_process_rows(action_len, rows), **history)
    return append(ro, put(obs, np.int32), put(obs_len, np.int32), put(reward, np.float32), put(done, bool))


def run_turns_host(generate: Callable[[Rollout], tuple[Rollout, jax.Array, jax.Array]],
                   append: Callable[[Rollout, Any, Any, Any, Any], Rollout], env: HostEnv, ro: Rollout) -> Rollout:
    """`run_turns` with the environment on the host: `play_turn_host` until every episode ended. Every
    process sees every row's `done`, so all stop after the same turn."""
    for _ in range(env.max_turns):
        if to_host(ro.tree.done).all():
            break
        ro = play_turn_host(generate, append, env, ro)
    return ro


def max_len(prompt_width: int, spec: TurnSpec) -> int:
    """Slot length that fits a prompt and max_turns full turns with observations."""
    return prompt_width + spec.max_turns * (spec.action_len + spec.obs_len)
