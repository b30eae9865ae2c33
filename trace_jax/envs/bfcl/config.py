"""BFCL settings (`env: bfcl`, the run's `task:` section): the policy, the entries and their split, the turn shapes."""

from __future__ import annotations

import dataclasses

from trace_jax.envs.bfcl.calls import DECODINGS
from trace_jax.envs.bfcl.data import SUBSETS
from trace_jax.models.config import dtype_name


@dataclasses.dataclass(frozen=True)
class BfclConfig:
    """BFCL v4 multi-turn function calling: Qwen3 `<tool_call>` messages run on each episode's own API instances."""

    policy_dir: str = "artifacts/bfcl_tiny/policy"  # local HF Qwen3 dir: config, safetensors, tokenizer
    dtype: str = "float32"  # the policy's compute dtype; params and Adam stay float32 (bfloat16: mixed precision)
    subsets: tuple[str, ...] = SUBSETS  # the multi-turn subsets trained and evaluated (base, miss_func, ...)
    entry_ids: tuple[str, ...] = ()  # only these entries, e.g. multi_turn_base_132 (empty: every entry of subsets)
    split_seed: int = 0  # the seeded 80/20 train/eval split of the scenarios (written to <out_dir>/split.json)
    eval_entries: int = 0  # per subset, the first n evaluation entries (0: all)
    max_turns: int = 32  # T: model steps (assistant messages) per episode at most; past it the episode scores 0
    action_len: int = 512  # A: tokens of one assistant message at most
    obs_len: int = 1024  # O: observation tokens per step at most (tool results are shortened to fit)
    prompt_len: int = 4096  # P: prompt tokens at most (longer entries are skipped, and counted)
    cache_size: int = 4096  # API-state snapshots kept for forks (0: a fork replays its history instead)
    # how a message's calls are read, in training and eval: "bfcl", as bfcl's Qwen handler (calls after </think>, its
    # block pattern, a message whose calls all fail to decode ends the turn); "lenient": every block, malformed
    # ones answered with an error result and the turn going on (scores are then not bfcl's)
    decoding: str = "bfcl"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype, "task.dtype"))
        object.__setattr__(self, "subsets", tuple(self.subsets))
        object.__setattr__(self, "entry_ids", tuple(self.entry_ids))
        for name in ("max_turns", "action_len", "obs_len", "prompt_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name} must be >= 1, got {getattr(self, name)}")
        if self.decoding not in DECODINGS:
            raise ValueError(f"task.decoding={self.decoding!r} is not one of {list(DECODINGS)}")
        if self.eval_entries < 0 or self.cache_size < 0:
            raise ValueError("task.eval_entries and task.cache_size must be >= 0")
        unknown = sorted(set(self.subsets) - set(SUBSETS))
        if unknown or not self.subsets:
            raise ValueError(f"task.subsets must name some of {list(SUBSETS)}, got {list(self.subsets)}")
        outside = [i for i in self.entry_ids if not any(i.startswith(f"multi_turn_{s}_") for s in self.subsets)]
        if outside:
            raise ValueError(f"task.entry_ids {outside} are not entries of task.subsets={list(self.subsets)}; "
                             "add their subset or drop them")
