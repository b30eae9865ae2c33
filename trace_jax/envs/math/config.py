"""Math settings (`env: math`, the run's `task:` section): the policy, the problems, the turn shapes, the tools."""

from __future__ import annotations

import dataclasses

from trace_jax.envs.math.sandbox import SandboxConfig
from trace_jax.models.config import dtype_name


@dataclasses.dataclass(frozen=True)
class MathConfig:
    """Tool-integrated math (ToRL / SimpleTIR format): reason, run ```python blocks, answer in \\boxed{}."""

    policy_dir: str = "artifacts/math_tiny/policy"  # local HF Qwen3 dir: config, safetensors, tokenizer
    dtype: str = "float32"  # the policy's compute dtype; params and Adam stay float32 (bfloat16: mixed precision)
    problems_dir: str = "artifacts/math_tiny/problems"  # train.{jsonl,json,parquet} and eval/<set>.<ext> (manual_dir)
    eval_sets: tuple[str, ...] = ()  # the eval/<set> files evaluated (empty: all of them)
    eval_problems: int = 0  # per evaluation set, the first n problems (0: all)
    eval_samples: int = 1  # k of avg@k: sampled answers per evaluation problem
    max_tool_calls: int = 4  # code blocks run per episode at most; the turn after the last must answer
    action_len: int = 512  # A: policy tokens per turn at most
    obs_len: int = 256  # O: observation tokens per turn at most (the output is cut to fit)
    prompt_len: int = 512  # P: prompt tokens at most (longer problems are skipped, and counted)
    verify_timeout_s: float = 10.0  # a comparison of the verifier running longer scores 0
    sandbox: SandboxConfig = SandboxConfig()  # the interpreter's workers and limits

    @property
    def max_turns(self) -> int:
        """T: the engine's turns per episode, tool calls and the answer."""
        return self.max_tool_calls + 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype, "task.dtype"))
        for name in ("action_len", "obs_len", "prompt_len", "eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_tool_calls < 0 or self.eval_problems < 0:
            raise ValueError("task.max_tool_calls and task.eval_problems must be >= 0")
