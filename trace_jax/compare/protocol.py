"""A comparison's protocol, written into its results folder as PROTOCOL.md before any of its runs.

It is generated from the comparison's config, so what it says is what the runs do; an existing PROTOCOL.md is kept
as it is (a deviation is written into it by hand, with its reason, under "Deviations").
"""

from __future__ import annotations

import datetime
from pathlib import Path

from trace_jax.compare.config import CompareConfig
from trace_jax.compare.methods import METHOD_NOTES, method_fields, parse_methods

PROTOCOL_FILE = "PROTOCOL.md"
CONFIDENCE = 0.95  # of the paired intervals (summary.paired_differences)


def eval_steps(steps: int, every: int) -> list[int]:
    """The steps a run evaluates the test split at: 0, every, 2 * every, ..., and the last."""
    return sorted({0, *range(every, steps + 1, every), steps}) if every > 0 else [0, steps]


def protocol_text(ccfg: CompareConfig, now: datetime.datetime | None = None) -> str:
    """PROTOCOL.md for `ccfg`: task, base policy, methods, seeds, steps, evaluation, equal cost, metric, comparison."""
    t = ccfg.train
    methods = parse_methods(ccfg.methods)
    seeds = [t.seed + k for k in range(ccfg.seeds)]
    now = now or datetime.datetime.now(datetime.UTC)
    task = f"`{t.env}`"
    if t.env == "hopworld":
        task += (f", world {_inline(t.world)}; base policy `{t.init_checkpoint}` (built when missing by SFT with "
                 f"{_inline(t.sft, ('steps', 'mistake_prob', 'wrong_answer_prob', 'blind_spot', 'blind_spot_prob'))})")
    lines = [
        "# Protocol", "",
        f"Written by `trace-jax compare` on {now:%Y-%m-%d %H:%M} UTC from this folder's compare.yaml, before any of "
        "its runs. The runs follow it. A deviation is written below, under Deviations, with its reason.", "",
        f"- **Task**: {task}.",
        f"- **Start**: for each seed, one predictor warm-up of the base policy ({t.warmup.batches} pools of "
        f"{t.roots // t.warmup.group_size} prompts x {t.warmup.group_size} root rollouts x {t.continuations} "
        "continuations) saved once; every method of that seed starts from it.",
        "- **Methods** (only the allocator and its budgets differ; the configs are compared key by key before "
        "training):",
        *(f"  - `{m}`: {METHOD_NOTES[m.split('@')[0]]}" + _budget(m) for m in methods),
        f"- **Seeds**: {', '.join(map(str, seeds))}, fixed. Seed s gives every method the same prompts, warm-up and "
        "evaluation keys.",
        f"- **Steps**: {t.steps} per run; pool {t.pool_size} prompts, M = {t.roots} root rollouts, N = "
        f"{t.continuations} continuations per root, group size {t.group_size}, temperature {t.temperature}, "
        f"top-p {t.top_p}, learning rate {t.learning_rate}.",
        f"- **Evaluation**: the test split, {t.eval_samples} sampled episodes per question at temperature "
        f"{t.temperature}, at steps {', '.join(map(str, eval_steps(t.steps, t.eval_every)))}.",
        f"- **Equal cost** (`equal_cost: {t.equal_cost}`, reference `{t.cost_reference}`): prefix-free methods get "
        "the M whose expected generated tokens match one expansion of the reference at step 0. Trees change length "
        "as the policy learns, so runs drift apart in tokens; every run is therefore read at the same cumulative "
        "generated policy tokens T*, the fewest any run of the comparison reached.",
        "- **Primary metric**: test success at T*, interpolated linearly between a run's evaluations.",
        f"- **Comparison**: `{methods[0]}` minus each other method at T*, paired by seed; the mean difference over "
        f"the {len(seeds)} seeds with a two-sided {CONFIDENCE:.0%} Student-t interval ({len(seeds) - 1} degrees of "
        "freedom). An interval that contains 0 is reported as no measured difference.",
        "- **Described, not tested**: per run, the effective ratio, mixed prompts per 1000 generated tokens, tokens "
        "per step, the gain in test success from step 0 to T*, and the predictor's root and prefix AUC.", "",
        "## Deviations", "", "None.", "",
    ]
    return "\n".join(lines)


def write_protocol(ccfg: CompareConfig, out_dir: Path) -> Path:
    """out_dir/PROTOCOL.md, written unless it exists (it then stays as written, deviations and all)."""
    path = Path(out_dir) / PROTOCOL_FILE
    if not path.exists():
        path.write_text(protocol_text(ccfg))
    return path


def _inline(section: object, keys: tuple[str, ...] | None = None) -> str:
    fields = keys or tuple(section.__dataclass_fields__)  # type: ignore[attr-defined]
    return "`" + ", ".join(f"{k}={getattr(section, k)}" for k in fields) + "`"


def _budget(method: str) -> str:
    fields = method_fields(method)
    return f" (M = {fields['roots']}, N = {fields['continuations']})" if "roots" in fields else ""
