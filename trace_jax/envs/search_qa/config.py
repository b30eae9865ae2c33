"""Search QA settings: the policy directory, the QA data, the turn shapes and the retriever."""

from __future__ import annotations

import dataclasses

from trace_jax.models.config import dtype_name
from trace_jax.retrieval.client import RetrieverConfig

DATASETS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")  # Search-R1's seven


@dataclasses.dataclass(frozen=True)
class SearchQAConfig:
    """Search QA (`env: search_qa`): a local HF Qwen3 policy searching a corpus through a retriever."""

    policy_dir: str = "artifacts/search_qa_tiny/policy"  # local HF Qwen3 dir: config, safetensors, tokenizer
    dtype: str = "float32"  # the policy's compute dtype; params and Adam stay float32 (bfloat16: mixed precision)
    qa_dir: str = "artifacts/search_qa_tiny/qa"  # <dataset>/<split>.{jsonl,parquet} (TFDS manual_dir)
    train_datasets: tuple[str, ...] = ("nq",)  # trained on their train split
    eval_datasets: tuple[str, ...] = ("nq", "hotpotqa")  # evaluated on test, or dev where there is no test
    eval_questions: int = 0  # per dataset, the first n of the split (0: all)
    max_turns: int = 4  # T: turns per episode; the last one must answer
    action_len: int = 500  # A: policy tokens per turn at most
    obs_len: int = 500  # O: observation tokens per turn at most (passages are cut to fit)
    prompt_len: int = 256  # P: prompt tokens at most (longer questions are skipped, and counted)
    retriever: RetrieverConfig = RetrieverConfig()  # how the retriever is called

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype, "search_qa.dtype"))
        for name in ("max_turns", "action_len", "obs_len", "prompt_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"search_qa.{name} must be >= 1, got {getattr(self, name)}")
        for d in self.train_datasets + self.eval_datasets:
            if d not in DATASETS:
                raise ValueError(f"search_qa dataset {d!r} is not one of {', '.join(DATASETS)}")
        if not self.train_datasets:
            raise ValueError("search_qa.train_datasets must name at least one dataset")
        if self.eval_questions < 0:
            raise ValueError(f"search_qa.eval_questions must be >= 0 (0: all), got {self.eval_questions}")
