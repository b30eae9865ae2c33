"""What a task family plugs into the run loop (`train.loop.train`): a `Family` is registered by name
(`envs.registry`), and builds from a run's `TrainConfig` the `Task` that one run drives.

A family brings its data (pools of prompts, as token ids), its environment (a `JaxEnv`, rolled out inside the
compiled step, or a `HostEnv`, answered on the host between turns), its base policy, its evaluation and how its
final policy is saved; the loop brings everything else (warm-up, equal-cost budgets, steps, checkpoints, resume,
preemption, logs). Nothing outside the family's folder and the registry changes when a family is added
(docs/adding_a_task.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: the family modules import these, not this module them
    from jax.sharding import Mesh

    from trace_jax.config import TrainConfig
    from trace_jax.envs.base import HostEnv, JaxEnv
    from trace_jax.models.config import ModelConfig
    from trace_jax.models.qwen3 import Policy
    from trace_jax.rollout.expand import Pool


def jsonl_rows(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(where, value) for each non-blank line of a JSONL file produced elsewhere (a family's `score_responses`
    input), where = "path:line"; a line that is not UTF-8 or not JSON fails naming its place."""
    for lineno, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        where = f"{path}:{lineno}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}: not UTF-8 (byte {e.start + 1} of the line): write the file as UTF-8") from None
        if not text.strip():
            continue
        try:
            yield where, json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg})") from None


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One evaluation of a policy: what the loop logs and writes. JSON-safe (`as_json`), so a comparison computes
    its methods' shared step-0 evaluation once and hands it to each run."""

    metrics: dict[str, float]  # eval/* keys, logged in metrics.jsonl at the evaluation's step
    records: dict[str, list[dict]] = dataclasses.field(default_factory=dict)  # JSONL file -> rows (+ "step")
    texts: dict[str, str] = dataclasses.field(default_factory=dict)  # text file -> its content (rewritten)
    reliability: dict[str, dict[str, list[float]]] | None = None  # {"root": bins, "prefix": bins} of V~ (plotted)

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Evaluation:
        return cls(**data)


class Task(Protocol):
    """One run's family-specific parts, built by `Family.setup(cfg)`."""

    env: JaxEnv | HostEnv  # the environment every rollout of the run steps
    host: bool  # env is a HostEnv: turns on the host, the update compiled alone (else the whole step is one jit)
    pad_id: int  # the policy's pad token id

    def pool(self, step: int, mesh: Mesh | None) -> Pool:
        """The B prompts of training step `step` (1, 2, ...; 0: the equal-cost probe's), the same in every process
        and after a resume; rows split over mesh's data axes."""

    def warmup_pool(self, batch: int, mesh: Mesh | None) -> Pool:
        """The `batch`-th pool of the predictor warm-up (its own stream, apart from the training pools)."""

    def base_policy(self, mesh: Mesh | None) -> Policy:
        """The policy RL starts from (an SFT checkpoint, built if the family knows how, or an HF checkpoint)."""

    def evaluate(self, model: Policy, step: int, mesh: Mesh | None) -> Evaluation:
        """The held-out evaluation of `model` at `step` (its sampling keys derive from the run's seed and step)."""

    def save_policy(self, model: Policy, out_dir: Path) -> Path:
        """Saves the trained policy under out_dir (in the family's format, e.g. an HF checkpoint); its path."""

    def load_policy(self, path: Path) -> Policy:
        """A policy saved by `save_policy` (or another checkpoint the family reads), for `eval` and `show-tree`."""


@dataclasses.dataclass(frozen=True)
class TurnShape:
    """The static shapes of a family's episodes under a config: what the memory planner sizes."""

    prompt_len: int  # P: prompt tokens at most
    max_turns: int  # T
    action_len: int  # A
    obs_len: int  # O


@dataclasses.dataclass(frozen=True)
class Family:
    """A task family as the registry holds it: its name, how a run sets it up, and what the tools read of it."""

    name: str  # the value of `env` that selects it
    setup: Callable[[TrainConfig], Task]  # builds the run's Task (datasets, environment, tokenizer)
    turn_shape: Callable[[TrainConfig], TurnShape]  # the episodes' static shapes under a config
    policy_model: Callable[[TrainConfig, str | None], tuple[ModelConfig, str]]  # (dims, their source) for planning;
    # the second argument names a public model preset for when the checkpoint is not there yet
    description: str = ""  # one line for `--help` and errors
    success_metric: str = "eval/success"  # the eval/* key a comparison reads as test success (higher is better)
    policy_dir: str = "policy"  # the folder under out_dir that `save_policy` writes (a finished run has it)
    plot_keys: tuple[str, ...] = ()  # metrics.jsonl keys drawn in the run's plot (metrics.png)
    records: tuple[str, ...] = ()  # the JSONL files its evaluation appends to (`Evaluation.records`)
    config: type | None = None  # the dataclass of its `task:` config section (None: the family takes none)
    check_config: Callable[[TrainConfig], None] | None = None  # raises on a config the family cannot run
    score_responses: Callable[[TrainConfig, Path], Evaluation] | None = None  # grades responses written elsewhere
    # (`trace-jax eval --responses FILE.jsonl`), with no policy
    missing_inputs: Callable[[TrainConfig], list[str]] | None = None  # what a run needs staged besides its weights
    # (tokenizer, data files, services) that is missing, one line each naming its config key (`train.smoke`)


def task_section(cfg: TrainConfig, family: Family) -> Any:
    """cfg's `task:` section as `family.config` (an instance with defaults where the section is silent)."""
    from trace_jax.config import from_dict

    if family.config is None:
        if cfg.task:
            raise ValueError(f"env={family.name} takes no task.* settings, got {sorted(cfg.task)}")
        return None
    return from_dict(family.config, cfg.task, where="task.")
