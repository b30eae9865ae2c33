"""Fixed-shape, resumable batches of HopWorld prompts for the rollout engine.

Batch `step` is a pure function of (seed, step): example k = step * B + b is position k % N of
the seed's permutation for epoch k // N. The loader's position is one integer, saved with
`state()` and restored with `restore()`, so training resumes exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trace_jax.data.hopworld_tfds import read_split
from trace_jax.envs.hopworld import protocol, vocab
from trace_jax.envs.hopworld.config import HopWorldConfig


class PromptLoader:
    """Iterator of dicts: prompt_ids [B, P] int32 (right-padded with pad), prompt_len [B],
    question_id [B], hops [B] (int32)."""

    def __init__(
        self,
        examples: Sequence[Mapping[str, Any]],
        batch_size: int,
        prompt_len: int,
        seed: int,
        shuffle: bool = True,
    ):
        if not len(examples):
            raise ValueError("PromptLoader needs at least one example")
        rows = sorted(examples, key=lambda ex: int(ex["question_id"]))  # storage-order free
        prompts = [protocol.prompt_ids(vocab.encode(_text(ex["question"]))) for ex in rows]
        longest = max(len(p) for p in prompts)
        if longest > prompt_len:
            raise ValueError(f"a prompt has {longest} tokens, more than prompt_len={prompt_len}")
        self.prompt_ids, self.prompt_lens = protocol.pad_rows(prompts, prompt_len)  # [N, P], [N]
        self.question_ids = np.array([int(ex["question_id"]) for ex in rows], np.int32)  # [N]
        self.hops = np.array([int(ex["hops"]) for ex in rows], np.int32)  # [N]
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.step = 0

    def __len__(self) -> int:
        return len(self.question_ids)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self))

    def batch(self, step: int, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The batch at position `step` (does not move the loader); rows: only these rows of it (sorted indices
        in [0, B), e.g. one process's share)."""
        k = step * self.batch_size + (np.arange(self.batch_size) if rows is None else np.asarray(rows))
        epochs, pos = k // len(self), k % len(self)
        idx = np.empty(len(k), np.int64)
        for e in np.unique(epochs):
            idx[epochs == e] = self._order(int(e))[pos[epochs == e]]
        return {
            "prompt_ids": self.prompt_ids[idx],
            "prompt_len": self.prompt_lens[idx],
            "question_id": self.question_ids[idx],
            "hops": self.hops[idx],
        }

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        out = self.batch(self.step)
        self.step += 1
        return out

    def state(self) -> dict[str, int]:
        return {"seed": self.seed, "step": self.step}

    def restore(self, state: Mapping[str, int]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"loader state has seed {state['seed']}, this loader uses {self.seed}")
        self.step = int(state["step"])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def hopworld_loader(
    data_dir: str | Path,
    cfg: HopWorldConfig,
    split: str,
    batch_size: int,
    seed: int,
    shuffle: bool = True,
) -> PromptLoader:
    """A PromptLoader over a built HopWorld split (see hopworld_tfds.build_dataset)."""
    examples = read_split(data_dir, cfg, split)
    seeds = {int(ex["world_seed"]) for ex in examples}
    if seeds - {cfg.seed}:
        raise ValueError(f"{data_dir} holds questions of world seeds {seeds}, expected {cfg.seed}")
    return PromptLoader(examples, batch_size, cfg.prompt_len, seed, shuffle)
