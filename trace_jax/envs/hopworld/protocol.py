"""Protocol token ids (tags, pad, eos, chat tokens) and the fixed protocol sequences.

The one place the env, expert, tokenizer and data loader take protocol ids from. A policy turn is
`<think> ... </think>` followed by `<search> query </search>` or `<answer> name </answer>`,
optionally followed by end tokens (`<eos>`, `<|im_end|>`).
"""

from __future__ import annotations

import numpy as np

from trace_jax.envs.hopworld import vocab

PAD = vocab.WORD_TO_ID[vocab.PAD]
UNK = vocab.WORD_TO_ID[vocab.UNK]
EOS = vocab.WORD_TO_ID[vocab.EOS]
IM_START = vocab.WORD_TO_ID[vocab.IM_START]
IM_END = vocab.WORD_TO_ID[vocab.IM_END]
THINK = vocab.WORD_TO_ID[vocab.THINK]
THINK_END = vocab.WORD_TO_ID[vocab.THINK_END]
SEARCH = vocab.WORD_TO_ID[vocab.SEARCH]
SEARCH_END = vocab.WORD_TO_ID[vocab.SEARCH_END]
ANSWER = vocab.WORD_TO_ID[vocab.ANSWER]
ANSWER_END = vocab.WORD_TO_ID[vocab.ANSWER_END]
INFO = vocab.WORD_TO_ID[vocab.INFO]
INFO_END = vocab.WORD_TO_ID[vocab.INFO_END]
USER = vocab.WORD_TO_ID["user"]
ASSISTANT = vocab.WORD_TO_ID["assistant"]

# Ids that may not appear inside think/query/answer content: every special and tag token.
PROTOCOL_IDS: tuple[int, ...] = tuple(
    vocab.WORD_TO_ID[w] for w in vocab.SPECIAL_TOKENS + vocab.TAG_TOKENS
)
# Ids allowed after the closing action tag (the sampler may emit them before stopping).
END_IDS: tuple[int, ...] = (EOS, IM_END)

INVALID_OBS: tuple[int, ...] = tuple(vocab.encode(
    "<information> invalid action . use <search> query </search> or <answer> name </answer>"
    " </information>"
))


def prompt_ids(question: list[int]) -> list[int]:
    """Chat prompt for a question: `<|im_start|> user Q <|im_end|> <|im_start|> assistant`.

    Equal to the tokenizer's `apply_chat_template(..., add_generation_prompt=True)`.
    """
    return [IM_START, USER, *question, IM_END, IM_START, ASSISTANT]


PROMPT_OVERHEAD = len(prompt_ids([]))


def pad_rows(rows: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Token rows right-padded with PAD: (ids [N, width] int32, lengths [N] int32)."""
    longest = max((len(r) for r in rows), default=0)
    if longest > width:
        raise ValueError(f"a row has {longest} tokens, more than the width {width}")
    out = np.full((len(rows), width), PAD, np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out, np.array([len(r) for r in rows], np.int32)
