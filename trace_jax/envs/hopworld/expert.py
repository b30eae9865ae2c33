"""Scripted expert episodes (for SFT warm-up and tests), observed through the reference env.

The expert searches each entity on the question's path by its full name, reads the relation off
the world, and answers. With `mistake_prob` a search uses one piece of the name only (a sloppy
query that may return a confusable entity's document); the expert then notices and searches again
with the full name. With `wrong_answer_prob` it answers a confusable wrong entity (no recovery),
so SFT data is not perfect.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from trace_jax.envs.hopworld import protocol, reference, vocab
from trace_jax.envs.hopworld.config import HopWorldConfig
from trace_jax.envs.hopworld.world import RELATIONS, World


@dataclasses.dataclass(frozen=True)
class Turn:
    action: list[int]  # policy tokens of the turn
    obs: list[int]  # env observation tokens (empty after the final turn)


@dataclasses.dataclass(frozen=True)
class Episode:
    question_id: int
    prompt: list[int]  # chat prompt tokens
    turns: list[Turn]
    reward: float


def _turn(thought: str, tag: str, content: list[int]) -> list[int]:
    opener, closer = {"search": (protocol.SEARCH, protocol.SEARCH_END),
                      "answer": (protocol.ANSWER, protocol.ANSWER_END)}[tag]
    return [protocol.THINK, *vocab.encode(thought), protocol.THINK_END, opener, *content, closer]


def _confusable(world: World, entity: int, rng: np.random.Generator) -> int:
    """Another entity of the same type, sharing a name piece when one exists."""
    same_type = np.flatnonzero(world.entity_types == world.entity_types[entity])
    others = [int(e) for e in same_type if e != entity]
    sharing = [e for e in others if set(world.name_ids(e)) & set(world.name_ids(entity))]
    pool = sharing or others
    return pool[int(rng.integers(len(pool)))]


def expert_episode(
    world: World,
    cfg: HopWorldConfig,
    question_id: int,
    rng: np.random.Generator,
    mistake_prob: float = 0.0,
    wrong_answer_prob: float = 0.0,
    blind_type: int = -1,
    blind_prob: float = 0.0,
) -> Episode:
    """Play question `question_id` with the scripted expert through `reference.step`."""
    state = reference.reset(world, question_id)
    turns: list[Turn] = []

    def act(action: list[int]) -> tuple[list[int], float]:
        nonlocal state
        state, obs, reward, _ = reference.step(world, cfg, state, action)
        turns.append(Turn(action, obs))
        return obs, reward

    hops = int(world.hops[question_id])
    entity = int(world.question_starts[question_id])  # where the expert believes the chain has reached
    for k, relation in enumerate(world.question_paths[question_id, :hops].tolist()):
        name = world.name_ids(entity)
        thought = f"find the {RELATIONS[relation].noun} of {vocab.decode(name)}"
        spare_turns = cfg.max_turns - len(turns) - (hops - k) - 1
        found = entity
        if blind_prob > 0 and world.entity_types[entity] == blind_type and len(name) > 1 and rng.random() < blind_prob:
            obs, _ = act(_turn(thought, "search", name[:1]))
            found = _document_entity(world, obs)
        elif spare_turns > 0 and len(name) > 1 and rng.random() < mistake_prob:
            piece = name[int(rng.integers(len(name)))]
            obs, _ = act(_turn(thought, "search", [piece]))
            if obs[1: 1 + len(name)] != name:
                retry = f"wrong document . search again for {vocab.decode(name)}"
                act(_turn(retry, "search", name))
        else:
            act(_turn(thought, "search", name))
        target = int(world.relations[found, relation])
        entity = target if target >= 0 else _confusable(world, int(world.relations[entity, relation]), rng)

    if rng.random() < wrong_answer_prob:
        entity = _confusable(world, entity, rng)
    name = world.name_ids(entity)
    _, reward = act(_turn(f"so the answer is {vocab.decode(name)}", "answer", name))
    return Episode(question_id, protocol.prompt_ids(world.question_ids(question_id)), turns, reward)


def _document_entity(world: World, obs: list[int]) -> int:
    """The entity whose document a search observation `<information> doc </information>` shows."""
    doc = np.asarray(obs[1:-1])
    match = (world.doc_lens == len(doc)) & (world.docs[:, : len(doc)] == doc).all(1)
    return int(np.flatnonzero(match)[0])


def flatten(episode: Episode) -> tuple[np.ndarray, np.ndarray]:
    """The episode as one sequence for SFT: (tokens [T] int32, policy mask [T] int32), mask 1 on
    policy-generated tokens, 0 on prompt and observation tokens."""
    tokens, mask = list(episode.prompt), [0] * len(episode.prompt)
    for turn in episode.turns:
        tokens += turn.action + turn.obs
        mask += [1] * len(turn.action) + [0] * len(turn.obs)
    return np.asarray(tokens, np.int32), np.asarray(mask, np.int32)


def render(episode: Episode) -> str:
    """Readable text of an episode, one turn per paragraph."""
    lines = [vocab.decode(episode.prompt)]
    for turn in episode.turns:
        lines.append(vocab.decode(turn.action))
        if turn.obs:
            lines.append(vocab.decode(turn.obs))
    lines.append(f"reward: {episode.reward}")
    return "\n".join(lines)
