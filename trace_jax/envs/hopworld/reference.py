"""Plain-Python HopWorld env on lists of ints: the readable specification of `jax_env`."""

from __future__ import annotations

import dataclasses

from trace_jax.envs.hopworld import protocol, vocab
from trace_jax.envs.hopworld.config import HopWorldConfig
from trace_jax.envs.hopworld.world import World


@dataclasses.dataclass(frozen=True)
class RefState:
    answer: list[int]  # answer name tokens (no padding)
    turn: int = 0
    done: bool = False


def reset(world: World, question_id: int) -> RefState:
    return RefState(answer=world.name_ids(int(world.answers[question_id])))


def _is_content(token: int) -> bool:
    return 0 <= token < vocab.VOCAB_SIZE and token not in protocol.PROTOCOL_IDS


def parse_action(action: list[int]) -> tuple[str, list[int]]:
    """("search", query) | ("answer", name) | ("invalid", []) for one turn's tokens.

    Valid: <think> content* </think> then <search> content+ </search> or <answer> content+
    </answer>, then only end tokens (<eos>, <|im_end|>).
    """
    invalid: tuple[str, list[int]] = ("invalid", [])
    if not action or action[0] != protocol.THINK:
        return invalid
    i = 1
    while i < len(action) and _is_content(action[i]):
        i += 1
    if i == len(action) or action[i] != protocol.THINK_END:
        return invalid
    i += 1
    if i == len(action) or action[i] not in (protocol.SEARCH, protocol.ANSWER):
        return invalid
    kind, closer = (
        ("search", protocol.SEARCH_END) if action[i] == protocol.SEARCH
        else ("answer", protocol.ANSWER_END)
    )
    j = i + 1
    while j < len(action) and _is_content(action[j]):
        j += 1
    if j == len(action) or action[j] != closer or j == i + 1:
        return invalid
    if any(t not in protocol.END_IDS for t in action[j + 1:]):
        return invalid
    return kind, action[i + 1: j]


def retrieve(world: World, query: list[int]) -> int:
    """The entity whose score is highest (lowest id on ties), where score = 4 * name tokens in
    the query - 2 * name tokens not in it + query tokens found in the document."""
    def score(entity: int) -> int:
        name, doc = world.name_ids(entity), set(world.doc_ids(entity))
        hits = sum(1 for t in name if t in query)
        return 4 * hits - 2 * (len(name) - hits) + sum(1 for t in query if t in doc)

    return max(range(world.num_entities), key=lambda e: (score(e), -e))


def step(
    world: World, cfg: HopWorldConfig, state: RefState, action: list[int]
) -> tuple[RefState, list[int], float, bool]:
    """One turn: returns (state, observation tokens, reward, done). Tokens past
    cfg.action_len are dropped (the policy cannot generate them)."""
    if state.done:
        return state, [], 0.0, True
    kind, content = parse_action(list(action[: cfg.action_len]))
    turn = state.turn + 1
    done = kind == "answer" or turn >= cfg.max_turns
    reward = 1.0 if kind == "answer" and content == state.answer else 0.0
    if done:
        obs = []
    elif kind == "search":
        obs = [protocol.INFO, *world.doc_ids(retrieve(world, content)), protocol.INFO_END]
    else:
        obs = list(protocol.INVALID_OBS)
    return dataclasses.replace(state, turn=turn, done=done), obs, reward, done
