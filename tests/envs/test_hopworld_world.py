"""World generation: determinism, fixed vocabulary, sizes, consistency of facts and questions."""

import jax
import numpy as np

from trace_jax.envs.hopworld import protocol, vocab
from trace_jax.envs.hopworld.config import DOC_LEN, NAME_LEN, QUESTION_LEN, HopWorldConfig
from trace_jax.envs.hopworld.world import (
    NUM_RELATIONS,
    RELATIONS,
    World,
    build_world,
)


def _leaves_equal(a: World, b: World) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_deterministic_in_seed(cfg, world):
    assert _leaves_equal(world, build_world(cfg))
    other = build_world(HopWorldConfig(seed=cfg.seed + 1, num_entities=128, num_questions=400))
    assert not _leaves_equal(world, other)


def test_shapes_and_vocabulary(cfg, world):
    e, q = cfg.num_entities, cfg.num_questions
    assert world.names.shape == (e, NAME_LEN) and world.docs.shape == (e, DOC_LEN)
    assert world.relations.shape == (e, NUM_RELATIONS)
    assert world.questions.shape == (q, QUESTION_LEN)
    assert world.question_paths.shape == (q, cfg.max_hops)
    for arr in (world.names, world.docs, world.questions):
        assert arr.min() >= 0 and arr.max() < vocab.VOCAB_SIZE
    assert world.doc_lens.max() <= DOC_LEN and world.question_lens.max() <= QUESTION_LEN
    assert set(np.unique(world.hops)) == set(range(1, cfg.max_hops + 1))
    names = {tuple(world.name_ids(i)) for i in range(e)}
    assert len(names) == e, "entity names are unique"
    content = [t for i in range(e) for t in world.doc_ids(i)] + world.question_ids(0)
    assert not set(content) & set(protocol.PROTOCOL_IDS)


def test_world_is_a_pytree_with_static_seed(world):
    leaves, treedef = jax.tree.flatten(world)
    assert len(leaves) == 13
    assert jax.tree.unflatten(treedef, leaves).seed == world.seed


def test_questions_follow_relations(world):
    for q in range(world.num_questions):
        entity = int(world.question_starts[q])
        path = world.question_paths[q, : world.hops[q]].tolist()
        walked = [entity]
        for r in path:
            assert world.entity_types[entity] == RELATIONS[r].source
            entity = int(world.relations[entity, r])
            walked.append(entity)
        assert entity == world.answers[q] and world.chain(q) == walked
        assert (world.question_paths[q, world.hops[q]:] == -1).all()
        assert world.entity_name(int(world.question_starts[q])) in world.question_text(q)


def test_relation_table_is_consistent(world):
    rel = world.relations
    for e in range(world.num_entities):
        for r, t in enumerate(rel[e].tolist()):
            if world.entity_types[e] != RELATIONS[r].source:
                assert t == -1
            elif t >= 0:
                assert world.entity_types[t] == RELATIONS[r].target
                assert world.entity_name(t) in world.doc_text(e), "documents mention their facts"
    spouses = np.flatnonzero(rel[:, 3] >= 0)
    assert (rel[rel[spouses, 3], 3] == spouses).all()
    companies = np.flatnonzero(rel[:, 4] >= 0)
    assert (rel[rel[companies, 4], 1] == companies).all(), "a ceo works for the company"


def test_names_are_confusable(world):
    pieces = [t for e in range(world.num_entities) for t in world.name_ids(e)]
    counts = np.bincount(pieces)
    shared = sum(1 for e in range(world.num_entities)
                 if any(counts[t] > 1 for t in world.name_ids(e)))
    assert shared > 0.8 * world.num_entities
