"""The fixed HopWorld vocabulary: one word list, independent of the world seed.

Token id == position in `WORDS`, so the tokenizer built from it (trace_jax.data.tokenizer), the
pure-JAX env and the reference env all agree without a lookup table. Every entity name is built
from the one-token name pieces below, so one tokenizer serves every generated world.
"""

from __future__ import annotations

PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK, THINK_END = "<think>", "</think>"
SEARCH, SEARCH_END = "<search>", "</search>"
ANSWER, ANSWER_END = "<answer>", "</answer>"
INFO, INFO_END = "<information>", "</information>"

SPECIAL_TOKENS = (PAD, UNK, EOS, IM_START, IM_END)
TAG_TOKENS = (THINK, THINK_END, SEARCH, SEARCH_END, ANSWER, ANSWER_END, INFO, INFO_END)
ROLES = ("system", "user", "assistant")

FIRST_NAMES = (
    "Anna", "Karl", "Lena", "Omar", "Ines", "Tomas", "Mira", "Jonas", "Sara", "Viktor", "Elin",
    "Pavel", "Nora", "Hugo", "Alma", "Ravi", "Ida", "Felix", "Yara", "Emil", "Lea", "Oskar",
    "Nina", "Arne",
)
SURNAMES = (
    "Berg", "Lind", "Holm", "Dahl", "Strand", "Vik", "Moreau", "Novak", "Kaur", "Sato", "Costa",
    "Weber", "Falk", "Roos", "Brandt", "Ek", "Lund", "Aalto", "Varga", "Horn", "Marsh", "Quist",
    "Rahn", "Sund",
)
CITY_PREFIXES = ("North", "South", "East", "West", "New", "Old", "Port", "Lake")
PLACE_ROOTS = (
    "Tarvik", "Orvel", "Kessa", "Malden", "Brisk", "Corvo", "Dunmere", "Elsby", "Falun", "Grenn",
    "Halvar", "Istra", "Jorvik", "Kelda", "Lorn", "Mirren",
)
UNIVERSITY_KINDS = ("University", "Institute", "College")
COMPANY_ROOTS = (
    "Lumeco", "Vantor", "Quell", "Zenbo", "Norda", "Pelix", "Strato", "Tekra", "Ulmo", "Verso",
    "Wexa", "Xylo", "Yonder", "Zephyr", "Brio", "Cobalt",
)
COMPANY_SUFFIXES = ("Labs", "Group", "Systems", "Industries", "Motors", "Foods")
COUNTRIES = (
    "Veldra", "Ostmark", "Luria", "Carnis", "Belmora", "Drevia", "Sarnland", "Tolvia", "Aurel",
    "Kestria", "Norvane", "Pellia",
)

# Words of documents, questions, thoughts and the corrective observation.
FUNCTION_WORDS = (
    ".", "?", "what", "is", "the", "of", "born", "in", "works", "for", "studied", "at", "married",
    "to", "led", "by", "based", "located", "capital", "city", "country", "birthplace",
    "employer", "school", "spouse", "ceo", "headquarters", "find", "wrong", "document",
    "search", "again", "so", "answer", "invalid", "action", "use", "query", "name", "or",
)

WORDS: tuple[str, ...] = (
    SPECIAL_TOKENS + TAG_TOKENS + ROLES + FUNCTION_WORDS + FIRST_NAMES + SURNAMES
    + CITY_PREFIXES + PLACE_ROOTS + UNIVERSITY_KINDS + COMPANY_ROOTS + COMPANY_SUFFIXES
    + COUNTRIES
)
assert len(set(WORDS)) == len(WORDS), "vocabulary words must be unique"

VOCAB_SIZE = len(WORDS)
WORD_TO_ID: dict[str, int] = {w: i for i, w in enumerate(WORDS)}


def encode(text: str) -> list[int]:
    """Whitespace-split `text` into token ids; raises KeyError on an unknown word."""
    return [WORD_TO_ID[w] for w in text.split()]


def decode(ids: list[int]) -> str:
    """Join the words of `ids` with single spaces (ids outside the vocabulary render as <unk>)."""
    return " ".join(WORDS[i] if 0 <= i < VOCAB_SIZE else UNK for i in ids)
