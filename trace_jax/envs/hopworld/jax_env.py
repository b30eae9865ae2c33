"""Pure-JAX HopWorld env: token arrays in and out, static shapes, jit- and vmap-able.

Usage: `step = jax.jit(jax_env.step, static_argnums=1)`; `cfg` is hashable. Semantics are those of
`reference.py` (the readable version); tests check both agree token for token.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from trace_jax.envs.hopworld import protocol, vocab
from trace_jax.envs.hopworld.config import NAME_LEN, HopWorldConfig
from trace_jax.envs.hopworld.world import World

INVALID, SEARCH, ANSWER = 0, 1, 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EnvState:
    answer: jax.Array  # [NAME_LEN] int32 answer name tokens, pad-filled
    turn: jax.Array  # [] int32 turns taken
    done: jax.Array  # [] bool


def reset(world: World, question_id: jax.Array) -> EnvState:
    """Start an episode for question `question_id` ([] int32)."""
    answer = jnp.asarray(world.names)[jnp.asarray(world.answers)[question_id]]
    return EnvState(answer=answer.astype(jnp.int32), turn=jnp.int32(0), done=jnp.bool_(False))


def _isin(x: jax.Array, ids: tuple[int, ...]) -> jax.Array:
    return (x[..., None] == jnp.asarray(ids, x.dtype)).any(-1)


def _first(mask: jax.Array) -> jax.Array:
    """Index of the first True in `mask` ([A] bool), or A when there is none."""
    return jnp.where(mask.any(), jnp.argmax(mask), mask.shape[0]).astype(jnp.int32)


def parse_action(
    action: jax.Array, action_len: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Parse a turn ([A] int32, [] int32) into (kind, start, end): content is action[start:end].

    kind is INVALID, SEARCH or ANSWER.
    """
    size = action.shape[0]
    n = jnp.clip(action_len, 0, size)
    idx = jnp.arange(size)
    valid = idx < n
    content = (action >= 0) & (action < vocab.VOCAB_SIZE) & ~_isin(action, protocol.PROTOCOL_IDS)
    boundary = valid & ~content
    at = lambda p: action[jnp.minimum(p, size - 1)]

    think_end = _first(boundary & (idx >= 1))
    open_pos = think_end + 1
    close_pos = _first(boundary & (idx > open_pos))
    opener = at(open_pos)
    closer = jnp.where(opener == protocol.SEARCH, protocol.SEARCH_END, protocol.ANSWER_END)
    ok = (
        (n >= 1)
        & (action[0] == protocol.THINK)
        & (think_end < n)
        & (at(think_end) == protocol.THINK_END)
        & (open_pos < n)
        & ((opener == protocol.SEARCH) | (opener == protocol.ANSWER))
        & (close_pos < n)
        & (close_pos > open_pos + 1)
        & (at(close_pos) == closer)
        & (~valid | (idx <= close_pos) | _isin(action, protocol.END_IDS)).all()
    )
    kind = jnp.where(ok, jnp.where(opener == protocol.SEARCH, SEARCH, ANSWER), INVALID)
    return kind.astype(jnp.int32), open_pos + 1, close_pos


def retrieve(world: World, action: jax.Array, start: jax.Array, end: jax.Array) -> jax.Array:
    """Top entity for the query action[start:end]: argmax over entities (first on ties) of
    4 * name tokens in the query - 2 * name tokens not in it + query tokens in the document."""
    idx = jnp.arange(action.shape[0])
    qmask = (idx >= start) & (idx < end)
    ids = jnp.where(qmask, action, 0)
    qbag = jnp.zeros(vocab.VOCAB_SIZE, jnp.int32).at[ids].max(qmask.astype(jnp.int32))  # [V]
    names = jnp.asarray(world.names)  # [E, NAME_LEN]
    name_valid = jnp.arange(NAME_LEN) < jnp.asarray(world.name_lens)[:, None]  # [E, NAME_LEN]
    name_hits = (qbag[names] * name_valid).sum(-1)  # [E]
    name_misses = jnp.asarray(world.name_lens) - name_hits  # [E]
    body_hits = (jnp.asarray(world.doc_bag)[:, ids] & qmask).sum(-1)  # [E]
    return jnp.argmax(4 * name_hits - 2 * name_misses + body_hits).astype(jnp.int32)


def _document_obs(world: World, entity: jax.Array, obs_len: int) -> tuple[jax.Array, jax.Array]:
    doc = jnp.asarray(world.docs)[entity]  # [DOC_LEN]
    n = jnp.asarray(world.doc_lens)[entity]
    i = jnp.arange(obs_len)
    body = doc[jnp.clip(i - 1, 0, doc.shape[0] - 1)]
    obs = jnp.where(i == 0, protocol.INFO, jnp.where(i <= n, body, protocol.INFO_END))
    return jnp.where(i <= n + 1, obs, protocol.PAD).astype(jnp.int32), n + 2


def step(
    world: World, cfg: HopWorldConfig, state: EnvState, action: jax.Array, action_len: jax.Array
) -> tuple[EnvState, jax.Array, jax.Array, jax.Array, jax.Array]:
    """One policy turn. action: [A] int32 pad-filled, action_len: [] int32.

    Returns (state, obs [O] int32 pad-filled, obs_len [] int32, reward [] float32, done [] bool).
    A search is answered with its top document, an invalid turn with protocol.INVALID_OBS; a
    finished episode (answer given or max_turns reached) gets an empty observation and ignores
    further steps.
    """
    kind, start, end = parse_action(action, action_len)
    pos = jnp.clip(start + jnp.arange(NAME_LEN), 0, action.shape[0] - 1)
    answer_len = (state.answer != protocol.PAD).sum()
    correct = (end - start == answer_len) & (
        (action[pos] == state.answer) | (jnp.arange(NAME_LEN) >= answer_len)
    ).all()

    turn = state.turn + 1
    done = (kind == ANSWER) | (turn >= cfg.max_turns)
    reward = jnp.where((kind == ANSWER) & correct, 1.0, 0.0).astype(jnp.float32)

    doc_obs, doc_len = _document_obs(world, retrieve(world, action, start, end), cfg.obs_len)
    invalid = jnp.full(cfg.obs_len, protocol.PAD, jnp.int32)
    invalid = invalid.at[: len(protocol.INVALID_OBS)].set(jnp.asarray(protocol.INVALID_OBS))
    obs = jnp.where(kind == SEARCH, doc_obs, invalid)
    obs_len = jnp.where(kind == SEARCH, doc_len, len(protocol.INVALID_OBS))
    obs = jnp.where(done, protocol.PAD, obs)
    obs_len = jnp.where(done, 0, obs_len).astype(jnp.int32)

    was_done = state.done
    new_state = EnvState(
        answer=state.answer,
        turn=jnp.where(was_done, state.turn, turn),
        done=was_done | done,
    )
    return (
        new_state,
        jnp.where(was_done, protocol.PAD, obs),
        jnp.where(was_done, 0, obs_len),
        jnp.where(was_done, 0.0, reward),
        new_state.done,
    )
