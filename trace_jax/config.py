"""Typed, frozen configuration dataclasses shared across the project."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from trace_jax.envs.hopworld.config import ENTITY_TYPES, HopWorldConfig
from trace_jax.envs.search_qa.config import SearchQAConfig
from trace_jax.models.config import ModelConfig
from trace_jax.rollout.sampling import DRAWS

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh sizes for the axes (data, fsdp, tensor); one size may be -1 (fill)."""

    data: int = -1  # data-parallel axis size (-1: fill with the remaining devices)
    fsdp: int = 1  # fully-sharded data-parallel axis size
    tensor: int = 1  # tensor-parallel axis size

    def __post_init__(self) -> None:
        sizes = (self.data, self.fsdp, self.tensor)
        if any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh sizes must be positive or -1 (fill), got data={self.data}, "
                             f"fsdp={self.fsdp}, tensor={self.tensor}")
        if sizes.count(-1) > 1:
            raise ValueError("at most one mesh axis may be -1 (fill); set the others explicitly")

    def resolve(self, num_devices: int) -> tuple[int, int, int]:
        """Concrete (data, fsdp, tensor) sizes for `num_devices`, filling the -1 axis."""
        sizes = [self.data, self.fsdp, self.tensor]
        known = 1
        for s in sizes:
            known *= s if s != -1 else 1
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(f"cannot fill mesh: {num_devices} devices are not divisible by the "
                                 f"fixed axes product {known} (data={self.data}, fsdp={self.fsdp}, "
                                 f"tensor={self.tensor})")
            sizes[sizes.index(-1)] = num_devices // known
        elif known != num_devices:
            raise ValueError(f"mesh data*fsdp*tensor = {known} but {num_devices} devices are "
                             "available; set one axis to -1 to fill")
        return tuple(sizes)  # type: ignore[return-value]


def from_dict(cls: type[T], data: Mapping[str, Any] | None, where: str = "") -> T:
    """Build dataclass `cls` from a (nested) mapping; unknown keys and wrong types fail by name."""
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ValueError(f"config {where or '<root>'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown config key '{where}{unknown[0]}'; allowed keys"
                         f"{' under ' + where.rstrip('.') if where else ''}: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        kind = hints[name]
        key = f"{where}{name}"
        if dataclasses.is_dataclass(kind):
            default = _default(fields[name])
            base = {} if default is None else dataclasses.asdict(default)
            if not isinstance(value, Mapping):
                raise ValueError(f"config {key}: expected a mapping, got {value!r}")
            kwargs[name] = from_dict(kind, _merge(base, value), where=f"{key}.")
        else:
            kwargs[name] = _coerce(kind, value, key)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ValueError(f"config {where or '<root>'}: {e}") from e


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _coerce(kind: Any, value: Any, key: str) -> Any:
    args = typing.get_args(kind)
    if len(args) == 2 and type(None) in args:  # `T | None`: None, or a T
        return None if value is None else _coerce(next(a for a in args if a is not type(None)), value, key)
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        try:  # YAML 1.1 reads "1e-4" (no dot) as a string
            return float(value) if isinstance(value, str) else _fail(kind, value, key)
        except ValueError:
            pass
    elif kind is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(kind) is dict:
        if isinstance(value, Mapping):
            return dict(value)
    elif typing.get_origin(kind) is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(value)
    else:
        return value
    return _fail(kind, value, key)


def _fail(kind: Any, value: Any, key: str) -> typing.NoReturn:
    raise ValueError(f"config key {key!r}: expected {getattr(kind, '__name__', kind)}, got {value!r}")


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """['a.b=1', 'c=x'] -> {'a': {'b': 1}, 'c': 'x'} (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key=value (e.g. train.steps=10)")
        key, raw = item.split("=", 1)
        node = out
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
        try:
            node[leaf] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ValueError(f"override {item!r}: {raw!r} is not a valid YAML value ({e.problem}); quote a string "
                             f"that starts with a YAML symbol, e.g. {key}='\"{raw}\"'") from e
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in extra.items():
        merged[k] = _merge(merged[k], v) if isinstance(v, Mapping) and isinstance(merged.get(k), dict) else v
    return merged


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """`cls` from its defaults, then the YAML file at `path`, then key=value `overrides`."""
    data: dict[str, Any] = {}  # data-parallel axis size (-1: fill with the remaining devices)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: invalid YAML: {e}") from e
    return from_dict(cls, _merge(data, parse_overrides(overrides)))


def to_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass config as plain nested dicts (for YAML/JSON dumps)."""
    return dataclasses.asdict(cfg)


def _require_positive(cfg: Any, section: str, names: Sequence[str]) -> None:
    for name in names:
        if not getattr(cfg, name) > 0:  # NaN too
            raise ValueError(f"{section}.{name} must be positive, got {getattr(cfg, name)}")


def _require_nonnegative(cfg: Any, section: str, names: Sequence[str]) -> None:
    for name in names:
        if not getattr(cfg, name) >= 0:  # NaN too
            raise ValueError(f"{section}.{name} must be >= 0, got {getattr(cfg, name)}")


def _hopworld_policy() -> ModelConfig:
    """The HopWorld-sized policy: ~0.8M parameters, a CPU trains it in minutes."""
    from trace_jax.envs.hopworld.vocab import VOCAB_SIZE

    return ModelConfig(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=384, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10_000.0,
                       max_position_embeddings=512, tie_word_embeddings=True)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised warm-up of the HopWorld policy on scripted expert episodes."""

    world: HopWorldConfig = HopWorldConfig()  # the HopWorld whose expert episodes train the base policy
    model: ModelConfig = dataclasses.field(default_factory=_hopworld_policy)  # the policy (HopWorld-sized)
    out_dir: str = "runs/hopworld_sft"  # checkpoints/, tokenizer/, metrics.json, config.yaml
    data_dir: str = "artifacts/tfds"  # TFDS data dir; the HopWorld dataset is built here if missing
    seed: int = 0  # initialisation and batch order
    steps: int = 300  # optimizer steps
    batch_size: int = 32  # episodes per step
    learning_rate: float = 2e-3  # AdamW peak learning rate (warmup then cosine decay)
    warmup_steps: int = 20  # linear learning-rate warmup steps
    weight_decay: float = 0.01  # AdamW weight decay
    episodes: int = 4000  # expert episodes drawn from the train split (cycled over questions)
    mistake_prob: float = 0.3  # sloppy search then recovery, per hop
    wrong_answer_prob: float = 0.05  # confident wrong answer, no recovery
    blind_spot: str = ""  # an entity type ("person", "company", ...) the expert has a habit with: see blind_spot_prob
    blind_spot_prob: float = 0.8  # how often the expert searches a blind_spot entity by the first piece of its name
    #   and trusts whatever document comes back (no recovery); else by its full name. "" blind_spot: no habit
    eval_batch: int = 128  # slots per evaluation rollout
    eval_temperature: float = 1.0  # sampling temperature of the test-split evaluation
    log_every: int = 25  # steps between logged losses

    def __post_init__(self) -> None:
        _require_positive(self, "sft", ("steps", "batch_size", "episodes", "eval_batch", "log_every", "learning_rate"))
        _require_nonnegative(self, "sft", ("seed", "weight_decay", "eval_temperature"))  # eval_temperature 0: greedy
        if self.blind_spot not in ("", *ENTITY_TYPES):
            raise ValueError(f"sft.blind_spot={self.blind_spot!r} is not an entity type; use one of {ENTITY_TYPES} "
                             "or \"\" (no habit)")
        for name in ("mistake_prob", "wrong_answer_prob", "blind_spot_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"sft.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.model.predictor_layers:
            raise ValueError(f"sft.model.predictor_layers={self.model.predictor_layers}: SFT trains the policy, not "
                             "the predictor; set predictor_layers (the RL run adds them to the base policy)")
        if self.batch_size > self.episodes:
            raise ValueError(f"sft.batch_size={self.batch_size} exceeds sft.episodes={self.episodes}: a batch draws "
                             "distinct episodes; lower batch_size or raise episodes")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"sft.warmup_steps must be in [0, steps={self.steps}), got {self.warmup_steps}")


COST_MATCHING = ("tokens", "leaves", "none")


@dataclasses.dataclass(frozen=True)
class WarmupConfig:
    """Predictor warm-up between SFT and RL (`train/warmup.py`): the frozen base policy expands
    `batches` pools as uniform trees (M, N as in the run), then the success head alone is fitted."""

    batches: int = 16  # pools rolled out (0: no warm-up, the head starts at V~ = 0.5)
    group_size: int = 2  # root rollouts per prompt in the warm-up trees (M / group_size prompts a pool)
    fit_steps: int = 500  # full-batch Adam steps of the head fit; with predictor_layers, minibatches of fit_rows
    learning_rate: float = 0.01  # Adam learning rate of the head's fit
    fit_rows: int = 16  # with predictor_layers: episodes per minibatch of the fit
    layers_learning_rate: float = 1e-3  # with predictor_layers: AdamW learning rate of their fit with the head
    held_out: float = 0.25  # share of the drawn questions held out whole to report the fit on (AUC with interval)

    def __post_init__(self) -> None:
        if self.batches < 0:
            raise ValueError(f"warmup.batches must be >= 0 (0 skips the warm-up), got {self.batches}")
        _require_positive(self, "warmup", ("group_size", "fit_steps", "learning_rate", "fit_rows",
                                           "layers_learning_rate"))
        if not 0.0 < self.held_out < 1.0:
            raise ValueError(f"warmup.held_out={self.held_out} must lie strictly between 0 and 1: the share of "
                             "questions the fit is reported on, the rest being fitted on")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """RL with one allocator; `trace-jax train` with no arguments runs these defaults (HopWorld).

    env: the task family (`trace_jax.envs.registry`): "hopworld" (world, sft and init_checkpoint apply),
    "search_qa" (search_qa applies: a local HF Qwen3 policy searching a corpus through a retriever, trained from
    that checkpoint; no SFT is run), "math" (its settings in `task`: `envs.math.config.MathConfig`), or
    "module:attribute" naming a family of your own, whose settings go in `task` (docs/adding_a_task.md).
    """

    env: str = "hopworld"  # the task family: hopworld | search_qa | math | module:attribute (docs/adding_a_task.md)
    task: dict[str, Any] = dataclasses.field(default_factory=dict)  # the settings of math and plug-in families
    search_qa: SearchQAConfig = SearchQAConfig()  # policy, data, turns, retriever (env: search_qa)
    world: HopWorldConfig = HopWorldConfig()  # the HopWorld the run trains on (env: hopworld)
    sft: SFTConfig = SFTConfig()  # how the base policy is built when init_checkpoint is missing
    mesh: MeshConfig = MeshConfig()  # device mesh: data, fsdp, tensor axis sizes
    allocator: str = "trace"  # grpo | pcl | random_tree | uniform_tree | trace | trace_roots_uniform_prefix | ...
    pool_size: int = 32  # B: candidate prompts per step
    roots: int = 16  # M: root rollouts per step
    continuations: int = 2  # N: continuations per root rollout (tree allocators)
    group_size: int = 4  # rollouts per chosen prompt for uniform / PCL roots
    equal_cost: str = "tokens"  # how prefix-free allocators (grpo, pcl) size M: tokens | leaves | none
    cost_reference: str = "trace"  # the tree allocator whose generated tokens equal_cost=tokens matches
    match_group_size: bool = False  # grpo/pcl: group size = cost_reference's mean leaves per opened prompt
    max_per_anchor: int = 0  # cap on continuations per anchor for TRACE prefixes (0: no cap)
    max_roots_per_prompt: int = 0  # cap on root rollouts per prompt for TRACE roots (0: M), so a prompt fits a chunk
    chunk_slots: int = 0  # slots rolled out (and backpropagated) at once, whole prompts per chunk (0: all M*(1+N))
    refill_slots: int = -1  # S_live > 0: roll out on S_live rows, each taking the next episode as its own ends;
    # 0: synchronous turns over all M*(1+N) slots; -1 (auto): 4 rows per data-parallel device on CPU, else 0
    temperature: float = 1.0  # sampling temperature of rollouts (the loss scores tokens at the same temperature)
    top_p: float = 1.0  # nucleus sampling of rollouts (1: off); the loss scores tokens under the uncut distribution
    draw: str = "gumbel"  # how rollouts draw a token: gumbel (the tokens of jax.random.categorical) | inverse_cdf
    # (one uniform a row: the same distribution, other tokens under a seed, faster at large vocabularies)
    steps: int = 40  # RL steps (one expansion and one update each)
    learning_rate: float = 5e-5  # the policy's Adam learning rate
    max_grad_norm: float = 1.0  # global-norm gradient clipping, per optimizer group
    clip_eps: float = 0.2  # PPO ratio clipping of the policy loss
    kl_coef: float = 0.0  # k3 KL to the frozen base policy (0: no reference kept)
    predictor_coef: float = 1.0  # weight of the success head's squared error in the same loss
    head_learning_rate: float = 1e-3  # the success head's own optimizer group (the policy uses learning_rate)
    predictor_backbone_grad: bool = False  # let the predictor loss train the shared backbone too
    predictor_layers: int = 0  # the predictor's own layers, copied from the base policy's top ones (0: linear head)
    remat: bool = False  # the loss keeps each layer's input only and recomputes layers in the backward (less memory)
    pack_rows: int = -1  # R > 0: the update feeds each distinct token of the tree once, packed in R rows;
    # 0: off; -1 (auto): one row per data-parallel device on CPU, else 0
    pack_len: int = 0  # positions per packed row (0: R rows hold half of S x L); a tree too big runs unpacked
    pack_block: int = 16  # positions per block of a packed row: each slot's tokens start one (pack_len a multiple)
    warmup: WarmupConfig = WarmupConfig()  # the predictor warm-up before RL
    eval_every: int = 20  # steps between test-split evaluations (also at start and end)
    eval_batch: int = 128  # slots per evaluation rollout (one compilation)
    eval_samples: int = 4  # HopWorld: sampled episodes per test question (search QA answers each once)
    checkpoint_every: int = 10  # steps between checkpoints (and at the end)
    keep_checkpoints: int = 3  # newest checkpoints kept
    seed: int = 0  # prompts, rollouts, warm-up and evaluation keys all derive from it
    init_checkpoint: str = "runs/hopworld_sft/checkpoints"  # built with `sft` settings if missing
    out_dir: str = "runs/hopworld_trace"  # metrics, plots, checkpoints and the final policy; gs://bucket/run (the gcs
    # extra): written to a local copy (~/.cache/trace-jax/runs) mirrored there each step, continued on a new VM
    checkpoint_dir: str = ""  # orbax checkpoints ("": out_dir/checkpoints); several hosts: one all reach, gs://b/x
    data_dir: str = "artifacts/tfds"  # TFDS data (built on first use)

    def __post_init__(self) -> None:
        from trace_jax.allocation import ALLOCATORS

        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator={self.allocator!r} is not one of {sorted(ALLOCATORS)}")
        if not self.env:
            raise ValueError("env must name a task family: hopworld, search_qa, math or module:attribute")
        if ALLOCATORS.get(self.cost_reference, ("", "none"))[1] == "none":
            tree_allocators = sorted(k for k, (_, prefix) in ALLOCATORS.items() if prefix != "none")
            raise ValueError(f"cost_reference={self.cost_reference!r} must be a tree allocator: {tree_allocators}")
        if self.equal_cost not in COST_MATCHING:
            raise ValueError(f"equal_cost={self.equal_cost!r} is not one of {list(COST_MATCHING)}")
        _require_positive(self, "train", ("pool_size", "roots", "group_size", "steps", "eval_every", "eval_batch",
                                          "eval_samples", "checkpoint_every", "keep_checkpoints", "temperature",
                                          "learning_rate", "head_learning_rate", "clip_eps", "max_grad_norm"))
        _require_nonnegative(self, "train", ("seed", "kl_coef", "predictor_coef", "predictor_layers"))
        if self.roots < 2:
            raise ValueError(f"train.roots (M) must be >= 2 (a prompt needs two rollouts to contrast), "
                             f"got {self.roots}")
        if min(self.continuations, self.max_per_anchor, self.chunk_slots, self.refill_slots + 1) < 0:
            raise ValueError("train.continuations, max_per_anchor and chunk_slots must be >= 0, refill_slots >= -1")
        if self.chunk_slots and self.refill_slots > 0:
            raise ValueError(f"train.chunk_slots={self.chunk_slots} and train.refill_slots={self.refill_slots}: set "
                             "one; both bound the slots in flight (chunks: whole prompts in turn, refill: every "
                             "prompt on fewer rows)")
        if self.max_roots_per_prompt == 1 or self.max_roots_per_prompt < 0:
            raise ValueError(f"train.max_roots_per_prompt must be 0 (no cap) or >= 2, got {self.max_roots_per_prompt}")
        if self.chunk_slots:
            self._check_chunk()
        if self.roots % self.group_size:
            raise ValueError(f"train.group_size={self.group_size} must divide train.roots={self.roots}")
        if self.roots // self.group_size > self.pool_size:
            raise ValueError(f"train.roots / group_size = {self.roots // self.group_size} prompts exceeds "
                             f"pool_size={self.pool_size}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"train.top_p must be in (0, 1], got {self.top_p}")
        if self.draw not in DRAWS:
            raise ValueError(f"train.draw={self.draw!r}: use one of {DRAWS}")
        if self.pack_rows < -1 or self.pack_len < 0 or (self.pack_len > 0 and self.pack_rows <= 0):
            raise ValueError(f"train.pack_rows={self.pack_rows} and train.pack_len={self.pack_len}: pack_rows > 0 "
                             "packs the update in that many rows (-1: auto, 0: off), pack_len > 0 sets their "
                             "length (0: half the unpacked positions); pack_len needs pack_rows > 0 (auto packs "
                             "on a CPU only)")
        if self.pack_block < 1 or self.pack_len % self.pack_block:
            raise ValueError(f"train.pack_len={self.pack_len} must be a multiple of train.pack_block="
                             f"{self.pack_block} (>= 1): packed rows are laid in whole blocks")
        if self.roots % self.warmup.group_size:
            raise ValueError(f"warmup.group_size={self.warmup.group_size} must divide train.roots={self.roots}")
        if self.warmup.batches and self.roots // self.warmup.group_size > self.pool_size:
            raise ValueError(f"train.roots / warmup.group_size = {self.roots // self.warmup.group_size} warm-up "
                             f"prompts exceeds pool_size={self.pool_size}: raise warmup.group_size or pool_size")
        cap = self.max_roots_per_prompt
        if cap and ALLOCATORS[self.allocator][0] == "trace" and self.pool_size * cap < self.roots:
            raise ValueError(f"train.pool_size={self.pool_size} prompts x max_roots_per_prompt={cap} cannot take "
                             f"train.roots={self.roots} roots: raise max_roots_per_prompt or pool_size")


    def _check_chunk(self) -> None:
        """A chunk holds one prompt's whole tree: the largest root group, each root with its N continuations
        (prefix-free allocators: no continuations), and a warm-up prompt's uniform tree."""
        from trace_jax.allocation import ALLOCATORS

        root_rule, prefix_rule = ALLOCATORS[self.allocator]
        per_root = 1 + self.continuations if prefix_rule != "none" else 1
        largest = (self.max_roots_per_prompt or self.roots) if root_rule == "trace" else self.group_size
        need = {f"{self.allocator}'s largest prompt ({largest} roots x {per_root} slots)": largest * per_root}
        if self.warmup.batches:
            need[f"a warm-up prompt ({self.warmup.group_size} roots x {1 + self.continuations} slots)"] = (
                self.warmup.group_size * (1 + self.continuations))
        what, most = max(need.items(), key=lambda kv: kv[1])
        if self.chunk_slots < most:
            hint = " or set max_roots_per_prompt" if root_rule == "trace" and most == largest * per_root else ""
            raise ValueError(f"train.chunk_slots={self.chunk_slots} cannot hold {what} = {most} slots; raise "
                             f"chunk_slots to at least {most}{hint}")
