"""Deterministic generation of a HopWorld: typed entities, relations, documents and questions.

Entities (people, companies, cities, universities, countries) get names made of one-token pieces
from the fixed vocabulary, chosen so that many share a piece (`Anna Berg` / `Anna Lind` /
`Karl Berg`; `New Tarvik` / `Tarvik University`). Each entity has one document listing its facts,
which mention other entities. A question composes 1..max_hops relations from a named start
entity; its answer is an entity name.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from trace_jax.envs.hopworld import protocol, vocab
from trace_jax.envs.hopworld.config import DOC_LEN, ENTITY_TYPES, NAME_LEN, QUESTION_LEN, HopWorldConfig

PERSON, COMPANY, CITY, UNIVERSITY, COUNTRY = range(5)


class Relation(NamedTuple):
    source: int  # entity type it applies to
    target: int  # entity type it points at
    phrase: str  # document wording: "<name> . born in <target> ."
    noun: str  # question wording: "what is the birthplace of <name> ?"


RELATIONS = (
    Relation(PERSON, CITY, "born in", "birthplace"),
    Relation(PERSON, COMPANY, "works for", "employer"),
    Relation(PERSON, UNIVERSITY, "studied at", "school"),
    Relation(PERSON, PERSON, "married to", "spouse"),
    Relation(COMPANY, PERSON, "led by", "ceo"),
    Relation(COMPANY, CITY, "based in", "headquarters"),
    Relation(CITY, COUNTRY, "located in", "country"),
    Relation(UNIVERSITY, CITY, "located in", "city"),
    Relation(COUNTRY, CITY, "capital is", "capital"),
)
NUM_RELATIONS = len(RELATIONS)
BIRTHPLACE, EMPLOYER, SCHOOL, SPOUSE, CEO, HEADQUARTERS, LOCATED_IN, UNI_CITY, CAPITAL = range(
    NUM_RELATIONS
)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class World:
    """A generated world as arrays (E entities, Q questions, V vocabulary words, R relations)."""

    names: np.ndarray  # [E, NAME_LEN] int32 name tokens, pad-filled
    name_lens: np.ndarray  # [E] int32
    docs: np.ndarray  # [E, DOC_LEN] int32 document tokens, pad-filled
    doc_lens: np.ndarray  # [E] int32
    doc_bag: np.ndarray  # [E, V] bool: word v occurs in document e
    relations: np.ndarray  # [E, R] int32 target entity, -1 where the relation does not apply
    entity_types: np.ndarray  # [E] int32 (PERSON .. COUNTRY)
    questions: np.ndarray  # [Q, QUESTION_LEN] int32 question tokens, pad-filled
    question_lens: np.ndarray  # [Q] int32
    question_starts: np.ndarray  # [Q] int32 start entity
    question_paths: np.ndarray  # [Q, max_hops] int32 relations applied from the start, -1 padded
    answers: np.ndarray  # [Q] int32 answer entity
    hops: np.ndarray  # [Q] int32
    seed: int = dataclasses.field(metadata=dict(static=True))

    @property
    def num_entities(self) -> int:
        return self.names.shape[0]

    @property
    def num_questions(self) -> int:
        return self.questions.shape[0]

    def name_ids(self, entity: int) -> list[int]:
        return self.names[entity, : self.name_lens[entity]].tolist()

    def doc_ids(self, entity: int) -> list[int]:
        return self.docs[entity, : self.doc_lens[entity]].tolist()

    def question_ids(self, question: int) -> list[int]:
        return self.questions[question, : self.question_lens[question]].tolist()

    def chain(self, question: int) -> list[int]:
        """The entities a question walks: its start, then each hop's target (the last is the answer)."""
        entities = [int(self.question_starts[question])]
        for relation in self.question_paths[question, : self.hops[question]].tolist():
            entities.append(int(self.relations[entities[-1], relation]))
        return entities

    def entity_name(self, entity: int) -> str:
        return vocab.decode(self.name_ids(entity))

    def doc_text(self, entity: int) -> str:
        return vocab.decode(self.doc_ids(entity))

    def question_text(self, question: int) -> str:
        return vocab.decode(self.question_ids(question))

    def answer_text(self, question: int) -> str:
        return self.entity_name(int(self.answers[question]))


def _type_counts(num_entities: int) -> dict[int, int]:
    counts = {
        COUNTRY: min(max(num_entities // 32, 2), len(vocab.COUNTRIES)),
        CITY: num_entities * 3 // 20,
        UNIVERSITY: num_entities // 12,
        COMPANY: num_entities * 3 // 20,
    }
    counts[PERSON] = num_entities - sum(counts.values())
    return counts


def _sample_names(rng: np.random.Generator, counts: dict[int, int]) -> dict[int, list[str]]:
    """Distinct names per type, drawn from products of the fixed piece lists."""
    products = {
        PERSON: [f"{a} {b}" for a in vocab.FIRST_NAMES for b in vocab.SURNAMES],
        COMPANY: [f"{a} {b}" for a in vocab.COMPANY_ROOTS for b in vocab.COMPANY_SUFFIXES],
        CITY: [f"{a} {b}" for a in vocab.CITY_PREFIXES for b in vocab.PLACE_ROOTS],
        UNIVERSITY: [f"{a} {b}" for a in vocab.PLACE_ROOTS for b in vocab.UNIVERSITY_KINDS],
        COUNTRY: list(vocab.COUNTRIES),
    }
    return {
        t: [products[t][i] for i in rng.choice(len(products[t]), counts[t], replace=False)]
        for t in products
    }


def _sample_relations(rng: np.random.Generator, ids: dict[int, np.ndarray], num: int) -> np.ndarray:
    """[E, R] relation table consistent across entities (a ceo works for the company, ...)."""
    rel = np.full((num, NUM_RELATIONS), -1, np.int64)
    people, companies, cities = ids[PERSON], ids[COMPANY], ids[CITY]
    universities, countries = ids[UNIVERSITY], ids[COUNTRY]

    city_country = np.concatenate([
        countries[rng.permutation(len(countries))],
        rng.choice(countries, len(cities) - len(countries)),
    ])[rng.permutation(len(cities))]
    rel[cities, LOCATED_IN] = city_country
    for country in countries:
        rel[country, CAPITAL] = rng.choice(cities[city_country == country])
    rel[universities, UNI_CITY] = rng.choice(cities, len(universities))

    rel[companies, HEADQUARTERS] = rng.choice(cities, len(companies))
    rel[companies, CEO] = rng.choice(people, len(companies), replace=False)
    rel[people, BIRTHPLACE] = rng.choice(cities, len(people))
    rel[people, EMPLOYER] = rng.choice(companies, len(people))
    rel[rel[companies, CEO], EMPLOYER] = companies
    has_school = rng.random(len(people)) < 0.85
    rel[people[has_school], SCHOOL] = rng.choice(universities, int(has_school.sum()))
    married = rng.permutation(people)[: 2 * (len(people) * 3 // 10)].reshape(-1, 2)
    rel[married[:, 0], SPOUSE] = married[:, 1]
    rel[married[:, 1], SPOUSE] = married[:, 0]
    return rel


def _document(names: list[str], rel_row: np.ndarray, entity: int) -> str:
    facts = [f"{RELATIONS[r].phrase} {names[t]} ." for r, t in enumerate(rel_row) if t >= 0]
    return " ".join([names[entity], ".", *facts])


def _question(names: list[str], start: int, path: list[int]) -> str:
    nouns = " of the ".join(RELATIONS[r].noun for r in reversed(path))
    return f"what is the {nouns} of {names[start]} ?"


def _sample_questions(
    rng: np.random.Generator, rel: np.ndarray, cfg: HopWorldConfig
) -> list[tuple[int, list[int], int]]:
    """Distinct (start, relation path, answer) triples; paths never revisit an entity."""
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[int, list[int], int]] = []
    for _ in range(cfg.num_questions * 50):
        if len(out) == cfg.num_questions:
            return out
        hops = int(rng.integers(1, cfg.max_hops + 1))
        start = int(rng.integers(rel.shape[0]))
        path, visited = [], [start]
        while len(path) < hops:
            options = [r for r in range(NUM_RELATIONS) if rel[visited[-1], r] >= 0
                       and rel[visited[-1], r] not in visited]
            if not options:
                break
            r = int(rng.choice(options))
            path.append(r)
            visited.append(int(rel[visited[-1], r]))
        key = (start, *path)
        if len(path) == hops and key not in seen:
            seen.add(key)
            out.append((start, path, visited[-1]))
    raise ValueError(
        f"could not draw {cfg.num_questions} distinct questions from {cfg.num_entities} entities;"
        " lower num_questions or raise num_entities"
    )


def build_world(cfg: HopWorldConfig) -> World:
    """Generate the world of `cfg` (deterministic in cfg.seed and the size fields)."""
    rng = np.random.default_rng(cfg.seed)
    counts = _type_counts(cfg.num_entities)
    type_names = _sample_names(rng, counts)
    entity_types = np.concatenate([np.full(counts[t], t, np.int32) for t in range(len(ENTITY_TYPES))])
    names = [n for t in range(len(ENTITY_TYPES)) for n in type_names[t]]
    ids = {t: np.flatnonzero(entity_types == t) for t in range(len(ENTITY_TYPES))}
    rel = _sample_relations(rng, ids, cfg.num_entities)

    name_arr, name_lens = protocol.pad_rows([vocab.encode(n) for n in names], NAME_LEN)
    doc_rows = [vocab.encode(_document(names, rel[e], e)) for e in range(cfg.num_entities)]
    docs, doc_lens = protocol.pad_rows(doc_rows, DOC_LEN)
    doc_bag = np.zeros((cfg.num_entities, vocab.VOCAB_SIZE), bool)
    for e, row in enumerate(doc_rows):
        doc_bag[e, row] = True

    qs = _sample_questions(rng, rel, cfg)
    questions, question_lens = protocol.pad_rows(
        [vocab.encode(_question(names, s, p)) for s, p, _ in qs], QUESTION_LEN
    )
    paths = np.full((len(qs), cfg.max_hops), -1, np.int32)
    for i, (_, p, _) in enumerate(qs):
        paths[i, : len(p)] = p
    return World(
        names=name_arr,
        name_lens=name_lens,
        docs=docs,
        doc_lens=doc_lens,
        doc_bag=doc_bag,
        relations=rel.astype(np.int32),
        entity_types=entity_types,
        questions=questions,
        question_lens=question_lens,
        question_starts=np.array([s for s, _, _ in qs], np.int32),
        question_paths=paths,
        answers=np.array([a for _, _, a in qs], np.int32),
        hops=np.array([len(p) for _, p, _ in qs], np.int32),
        seed=cfg.seed,
    )
