"""Search QA questions as token prompts: the TFDS splits (built from the QA files on first use), each
question through the tokenizer's chat template once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from trace_jax.data.search_qa_tfds import build_qa, read_qa
from trace_jax.envs.search_qa.config import SearchQAConfig
from trace_jax.envs.search_qa.env import prompt_ids


@dataclasses.dataclass(frozen=True)
class QuestionSet:
    """Questions with global ids `ids` [n] (indices into `Questions.golds`) and their prompts."""

    ids: np.ndarray  # [n] int32
    tokens: np.ndarray  # [n, P] int32, right-padded
    lengths: np.ndarray  # [n] int32


@dataclasses.dataclass(frozen=True)
class Questions:
    train: QuestionSet
    evals: dict[str, QuestionSet]  # dataset -> its test (or dev) split
    golds: list[list[str]]  # per global id
    skipped: int  # questions whose prompt exceeds prompt_len


def eval_split(data_dir: str | Path, qa_dir: str | Path, dataset: str) -> str:
    """The split a dataset is evaluated on: test, or dev where it has none (as Search-R1 does)."""
    build_qa(data_dir, qa_dir, dataset)
    for split in ("test", "dev"):
        try:
            read_qa(data_dir, dataset, split)
            return split
        except ValueError:
            continue
    raise ValueError(f"{dataset} has neither a test nor a dev split in {qa_dir}; add {dataset}/test.jsonl")


def load_questions(cfg: SearchQAConfig, data_dir: str | Path, tokenizer: PreTrainedTokenizerBase, pad_id: int
                   ) -> Questions:
    golds: list[list[str]] = []
    skipped = 0

    def encode(rows: list[dict]) -> QuestionSet:
        nonlocal skipped
        ids, prompts = [], []
        for row in rows:
            p = prompt_ids(tokenizer, row["question"])
            if len(p) > cfg.prompt_len:
                skipped += 1
                continue
            ids.append(len(golds))
            golds.append(row["golden_answers"])
            prompts.append(p)
        tokens = np.full((len(prompts), cfg.prompt_len), pad_id, np.int32)
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = p
        return QuestionSet(np.asarray(ids, np.int32), tokens, np.asarray([len(p) for p in prompts], np.int32))

    train_rows = []
    for d in cfg.train_datasets:
        build_qa(data_dir, cfg.qa_dir, d)
        train_rows += read_qa(data_dir, d, "train")
    train = encode(train_rows)
    evals = {}
    for d in cfg.eval_datasets:
        rows = read_qa(data_dir, d, eval_split(data_dir, cfg.qa_dir, d))
        evals[d] = encode(rows[: cfg.eval_questions or None])
    if len(train.ids) == 0:
        raise ValueError(f"no training question fits search_qa.prompt_len={cfg.prompt_len}; raise it")
    empty = [d for d, qs in evals.items() if len(qs.ids) == 0]
    if empty:  # it would score 0 and pull the average down
        raise ValueError(f"no {empty[0]} evaluation question fits search_qa.prompt_len={cfg.prompt_len}; raise it "
                         "or leave the dataset out of search_qa.eval_datasets")
    return Questions(train, evals, golds, skipped)
