"""Plans a config's step on a pod (`trace-jax plan-memory`) and checks it fits before `train` does any work.

The chip table, named model presets, the largest chunk_slots whose step fits a chip's HBM with HEADROOM kept
free; the bytes themselves come from `memory.terms`.
"""

from __future__ import annotations

import dataclasses
import math

from jax.sharding import Mesh

from trace_jax.config import TrainConfig
from trace_jax.envs.registry import get_family
from trace_jax.memory.terms import StepShape, step_bytes
from trace_jax.models.config import ModelConfig

HEADROOM = 0.10  # share of a chip's HBM kept free for XLA's scratch, fragmentation and this model's error
GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    hbm_bytes: int  # high-bandwidth memory of one chip (one device as JAX sees it)
    source: str  # where the number comes from


# Cloud TPU's system-architecture pages (cloud.google.com/tpu/docs/<chip>) give the HBM per chip, read here as GiB;
# on a real device `check_fits` reads the device's own `bytes_limit` instead.
CHIPS = {c.name: c for c in (
    Chip("v4", 32 * GiB, "Cloud TPU docs, v4: 32 GiB HBM2 per chip"),
    Chip("v5e", 16 * GiB, "Cloud TPU docs, v5e: 16 GB HBM2 per chip"),
    Chip("v5p", 95 * GiB, "Cloud TPU docs, v5p: 95 GB HBM2e per chip"),
    Chip("v6e", 32 * GiB, "Cloud TPU docs, v6e (Trillium): 32 GB HBM per chip"),
    Chip("cpu", 8 * GiB, "nominal, for tests and dry runs: a CPU device reports no HBM limit"),
)}

# Dims of public Qwen3 checkpoints (their HF config.json), for planning before the weights are downloaded.
PRESETS = {
    "qwen3-8b": ModelConfig(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36,
                            num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=40960),
    "qwen3-14b": ModelConfig(vocab_size=151936, hidden_size=5120, intermediate_size=17408, num_layers=40,
                             num_heads=40, num_kv_heads=8, head_dim=128, max_position_embeddings=40960),
}


def model_of(cfg: TrainConfig, preset: str | None = None) -> tuple[ModelConfig, str]:
    """(the policy's dims, where they come from), as cfg's task family loads it (`Family.policy_model`): HopWorld's
    sft.model, search QA's <policy_dir>/config.json, ...; `preset` names PRESETS dims to use when the family's
    checkpoint is not there yet."""
    return get_family(cfg.env).policy_model(cfg, preset)


def step_shape(cfg: TrainConfig, preset: str | None = None) -> StepShape:
    """The shapes of cfg's step. Prefix-free allocators (grpo, pcl) at equal cost get N = 0 and at most
    M * (1 + N) roots (`train.loop.equal_cost_budget`); the planner takes that bound. A prompt's largest group of
    roots follows `allocation.Allocator.largest_group`."""
    from trace_jax.allocation import ALLOCATORS

    model, source = model_of(cfg, preset)
    turns = get_family(cfg.env).turn_shape(cfg)
    width, action, obs = turns.prompt_len, turns.action_len, turns.obs_len
    m, n = cfg.roots, cfg.continuations
    root_rule, prefix_rule = ALLOCATORS[cfg.allocator]
    if prefix_rule == "none":
        m, n = (m if cfg.equal_cost == "none" else m * (1 + n)), 0
    largest = min(cfg.max_roots_per_prompt or m, m) if root_rule == "trace" else cfg.group_size
    return StepShape(model=model, model_source=source, pool=cfg.pool_size, prompt_width=width, roots=m,
                     continuations=n, largest_group=largest, max_turns=turns.max_turns,
                     slot_len=width + turns.max_turns * (action + obs), obs_len=obs, reference=cfg.kl_coef > 0,
                     remat=cfg.remat)


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-chip bytes of one step at `slots` slots on a mesh of `chip`s."""

    chip: Chip
    mesh: tuple[int, int, int]  # data, fsdp, tensor
    model_source: str
    slots: int  # slot capacity planned: S, or the configured chunk_slots
    params_bytes: float  # policy (+ frozen reference)
    optimizer_bytes: float  # Adam's two moments
    tree_bytes: float  # the rollout tree of all S slots (tokens, masks, log-probs, boundary hidden states)
    kv_cache_bytes: float  # the rollout's KV caches at their peak
    rollout_bytes: float  # the rollout phase: KV caches plus forward temporaries
    activation_bytes: float  # the loss phase: residuals, loss head, gradients
    min_chunk_slots: int  # one prompt's largest tree (`StepShape.prompt_slots`), rounded up like chunk_slots (<= S)
    chunk_slots: int  # the largest capacity whose step fits (1 - HEADROOM) of HBM (S: the whole tree fits)

    @property
    def total_bytes(self) -> float:
        return (self.params_bytes + self.optimizer_bytes + self.tree_bytes
                + max(self.rollout_bytes, self.activation_bytes))

    @property
    def budget_bytes(self) -> float:
        return self.chip.hbm_bytes * (1 - HEADROOM)

    @property
    def chips(self) -> int:
        return math.prod(self.mesh)

    def as_dict(self) -> dict[str, object]:
        """The plan as JSON-ready values (bytes per chip as integers)."""
        terms = ("params_bytes", "optimizer_bytes", "tree_bytes", "kv_cache_bytes", "rollout_bytes",
                 "activation_bytes", "total_bytes", "budget_bytes")
        return {"chip": self.chip.name, "chips": self.chips, "hbm_bytes": self.chip.hbm_bytes, "headroom": HEADROOM,
                "hbm_source": self.chip.source, "mesh": dict(zip(("data", "fsdp", "tensor"), self.mesh)),
                "model": self.model_source, "slots": self.slots, **{t: int(getattr(self, t)) for t in terms},
                "fits": self.total_bytes <= self.budget_bytes, "min_chunk_slots": self.min_chunk_slots,
                "chunk_slots": self.chunk_slots}


def plan_memory(shape: StepShape, chip: Chip, mesh: tuple[int, int, int], slots: int = 0) -> MemoryPlan:
    """The per-chip plan at `slots` slots (0: all S) on a (data, fsdp, tensor) mesh of `chip`s, and the largest
    chunk_slots that fits: S when the whole tree fits, else a multiple of data x fsdp x (1 + N), so that a chunk's
    R roots and R * N continuations both split evenly over the data-parallel devices (`rollout.chunks`)."""
    unit = mesh[0] * mesh[1] * (1 + shape.continuations)
    slots = slots or shape.slots
    plan = MemoryPlan(chip=chip, mesh=mesh, model_source=shape.model_source, slots=slots,
                      min_chunk_slots=min(-(-shape.prompt_slots // unit) * unit, shape.slots), chunk_slots=0,
                      **step_bytes(shape, slots, mesh))
    fits = lambda n: dataclasses.replace(plan, **step_bytes(shape, n, mesh)).total_bytes <= plan.budget_bytes
    if fits(shape.slots):
        return dataclasses.replace(plan, chunk_slots=shape.slots)
    lo, hi = 0, shape.slots // unit  # in units
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * unit) else (lo, mid - 1)
    return dataclasses.replace(plan, chunk_slots=lo * unit)


def plan_config(cfg: TrainConfig, chip: str | Chip, chips: int, preset: str | None = None, slots: int = 0
                ) -> MemoryPlan:
    """cfg's plan on `chips` chips of `chip` (a CHIPS name, or a Chip): its mesh filled to `chips`, at `slots` slots
    in flight (0: cfg's chunk_slots when set, else the whole tree). Fails naming the numbers when even the smallest
    chunk (one prompt's largest tree) does not fit."""
    if isinstance(chip, str):
        if chip not in CHIPS:
            raise ValueError(f"chip {chip!r} is not one of {sorted(CHIPS)}")
        chip = CHIPS[chip]
    mesh = cfg.mesh.resolve(chips)
    shape = step_shape(cfg, preset)
    plan = plan_memory(shape, chip, mesh, slots or cfg.chunk_slots)
    if plan.chunk_slots < plan.min_chunk_slots:
        at = plan_memory(shape, chip, mesh, plan.min_chunk_slots)
        unit = mesh[0] * mesh[1] * (1 + shape.continuations)
        raise ValueError(f"{chips} x {chip.name} cannot hold even one prompt's tree: {at.slots} slots "
                         f"({shape.largest_group} roots x (1 + N={shape.continuations}), rounded up to a multiple of "
                         f"data x fsdp x (1 + N) = {unit}) need {at.total_bytes / GiB:.1f} GiB per chip (params "
                         f"{at.params_bytes / GiB:.1f}, optimizer {at.optimizer_bytes / GiB:.1f}, KV cache "
                         f"{at.kv_cache_bytes / GiB:.1f}, loss phase {at.activation_bytes / GiB:.1f}), "
                         f"{at.budget_bytes / GiB:.1f} GiB usable of {chip.hbm_bytes / GiB:.0f} GiB HBM. Each chip "
                         "holds at least 1 + N rows of a chunk, so more chips shrink only the parameters and optimizer "
                         "state: use a larger mesh.tensor (it splits heads, MLP and vocabulary), shorter turns "
                         f"(L={shape.slot_len}), or a smaller max_roots_per_prompt")
    return plan


def check_fits(cfg: TrainConfig, mesh: Mesh, hbm_bytes: int | None = None, preset: str | None = None) -> None:
    """Before any work: fail if cfg's step does not fit the devices of `mesh`, naming the bytes needed and available
    and the chunk_slots to set. hbm_bytes: per device (default: what the devices report as `bytes_limit`; a CPU
    reports nothing and is not checked); preset: the PRESETS dims of a policy whose checkpoint is not there yet."""
    if hbm_bytes is None:
        stats = mesh.local_devices[0].memory_stats() or {}  # a device of this process (multi-host)
        if "bytes_limit" not in stats:
            return
        hbm_bytes = int(stats["bytes_limit"])
    device = Chip(mesh.local_devices[0].device_kind, hbm_bytes, "reported by the device")
    plan = plan_config(cfg, device, mesh.size, preset)
    if plan.total_bytes > plan.budget_bytes:
        raise ValueError(f"the step at {plan.slots} slots needs {plan.total_bytes / GiB:.1f} GiB per device, "
                         f"{plan.budget_bytes / GiB:.1f} GiB usable of {hbm_bytes / GiB:.1f} GiB; set "
                         f"chunk_slots={plan.chunk_slots} (`trace-jax plan-memory` prints the breakdown)")


def render(plan: MemoryPlan, shape: StepShape) -> str:
    """The plan as a table of GiB per chip, with the step's shapes and the chunk_slots to set."""
    c, (data, fsdp, tensor) = plan.chip, plan.mesh
    rows = [("params", plan.params_bytes, "policy" + (" + frozen reference (kl_coef > 0)" if shape.reference else "")),
            ("optimizer", plan.optimizer_bytes, "Adam's two moments"),
            ("tree", plan.tree_bytes, f"the rollout tree of all {shape.slots} slots"),
            ("kv_cache", plan.kv_cache_bytes,
             f"rollout: KV caches at their peak (rows running turns or forking, {plan.slots} slots)"),
            ("rollout", plan.rollout_bytes, "rollout: KV caches + forward temporaries"),
            ("activation", plan.activation_bytes, "loss: residuals, float32 [rows, L, V] head, gradients"),
            ("total", plan.total_bytes, "params + optimizer + tree + max(rollout, activation)")]
    m = shape.model
    lines = [f"{plan.chips} x {c.name}: {c.hbm_bytes / GiB:.0f} GiB HBM per chip ({c.source}); "
             f"{plan.budget_bytes / GiB:.1f} GiB usable at {HEADROOM:.0%} headroom",
             f"mesh: data={data} fsdp={fsdp} tensor={tensor}",
             f"model: {plan.model_source}: {m.num_layers} layers, hidden {m.hidden_size}, vocab {m.vocab_size}, "
             f"params {m.param_dtype}, compute {m.dtype}",
             f"step: B={shape.pool} prompts of P={shape.prompt_width}, M={shape.roots} x (1 + N={shape.continuations})"
             f" = S={shape.slots} slots of L={shape.slot_len} positions; planned: {plan.slots} slots at once", "",
             f"{'per chip':<12}{'GiB':>10}", *(f"{name:<12}{b / GiB:>10.2f}  {what}" for name, b, what in rows), ""]
    if plan.chunk_slots >= shape.slots:
        lines.append(f"chunk_slots: {plan.chunk_slots} (the whole tree fits: chunk_slots=0 runs it at once)")
    else:
        lines.append(f"chunk_slots: {plan.chunk_slots} (set chunk_slots={plan.chunk_slots}: the whole tree of "
                     f"{shape.slots} slots does not fit; one prompt's tree needs {plan.min_chunk_slots})")
    return "\n".join(lines)
