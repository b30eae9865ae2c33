"""HopWorldConfig: the frozen, hashable settings of a HopWorld (world size, turns, token limits)."""

from __future__ import annotations

import dataclasses

from trace_jax.envs.hopworld import protocol

NAME_LEN = 2  # tokens per entity name (countries use 1 and a pad)
DOC_LEN = 32  # tokens per document (the longest, a married person's, has 23)
QUESTION_LEN = 24  # tokens per question: 3 * hops + 5
ENTITY_TYPES = ("person", "company", "city", "university", "country")  # entity type ids are their positions


@dataclasses.dataclass(frozen=True)
class HopWorldConfig:
    """World generation and episode limits. Hashable, so it can be a static jit argument."""

    seed: int = 0  # the world: entities, relations, questions
    num_entities: int = 256  # entities in the world (32-512)
    num_questions: int = 2048  # questions, split 80/10/10 into train/validation/test
    max_hops: int = 4  # hops of the hardest questions
    max_turns: int = 6  # turns per episode (at least max_hops + 1)
    action_len: int = 24  # A: tokens the policy may generate per turn
    obs_len: int = 34  # O: tokens of one observation

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"world.seed must be >= 0, got {self.seed}")
        if not 32 <= self.num_entities <= 512:
            raise ValueError(f"num_entities must be in [32, 512], got {self.num_entities}")
        if self.num_questions < 10:
            raise ValueError(f"num_questions must be >= 10, got {self.num_questions}")
        if not 1 <= self.max_hops <= (QUESTION_LEN - 5) // 3:
            raise ValueError(
                f"max_hops must be in [1, {(QUESTION_LEN - 5) // 3}], got {self.max_hops}"
            )
        if self.max_turns < self.max_hops + 1:
            raise ValueError(
                f"max_turns ({self.max_turns}) must be >= max_hops + 1 ({self.max_hops + 1}):"
                " one search per hop and one answer"
            )
        if self.action_len < 5:
            raise ValueError(
                f"action_len must be >= 5 (the shortest valid turn), got {self.action_len}"
            )
        need = max(DOC_LEN + 2, len(protocol.INVALID_OBS))
        if self.obs_len < need:
            raise ValueError(
                f"obs_len must be >= {need} (a document and its two tags), got {self.obs_len}"
            )

    @property
    def prompt_len(self) -> int:
        """Tokens of the longest chat prompt (question plus chat tokens)."""
        return QUESTION_LEN + protocol.PROMPT_OVERHEAD
