"""Math with a code interpreter as a task family (`env: math`; settings: the run's `task:` section, `MathConfig`).

Each step's tree is rolled out through the host path: one sandbox call per turn for every live slot's code block,
one verifier call for the episodes that answer; then the update runs compiled. Evaluation reports avg@k per
evaluation set (k sampled answers per problem), tool calls per episode and the share of episodes that never box
an answer; every answer goes to a JSONL file. The trained policy is saved as an HF checkpoint with its tokenizer.
"""

from __future__ import annotations

import atexit
import dataclasses
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from trace_jax import distributed
from trace_jax.config import TrainConfig
from trace_jax.envs import hf_policy
from trace_jax.envs.family import Evaluation, Family, TurnShape, jsonl_rows, task_section
from trace_jax.envs.math.config import MathConfig
from trace_jax.envs.math.dataset import FORMATS, build_problems, read_problems
from trace_jax.envs.math.env import MathEnv, cache_size, prompt_ids
from trace_jax.envs.math.sandbox import SandboxPool
from trace_jax.envs.math.verifier import Verifier, answer_of
from trace_jax.evaluate_qa import episodes, responses
from trace_jax.models.config import ModelConfig
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import SamplingConfig

ANSWERS_FILE = "eval_answers.jsonl"  # one line per sampled answer: {"step", "set", "id", "sample", "response", ...}
PLOT_KEYS = ("reward", "effective_ratio", "eval/average/accuracy", "eval/average/tool_calls", "predictor_loss",
             "root_auc", "generated_tokens", "tool_calls", "entropy", "utilisation")


@dataclasses.dataclass(frozen=True)
class ProblemSet:
    """Problems with global ids `ids` [n] (indices into `MathTask.answers`) and their prompts."""

    ids: np.ndarray  # [n] int32
    tokens: np.ndarray  # [n, P] int32, right-padded
    lengths: np.ndarray  # [n] int32
    rows: list[dict[str, str]]  # {"id", "problem", "answer", "solution"} per problem


_TOOLS: dict[tuple, tuple[SandboxPool, Verifier]] = {}


def shared_tools(m: MathConfig) -> tuple[SandboxPool, Verifier]:
    """One sandbox pool and one verifier per process and settings, so the runs of a comparison share their worker
    processes; closed when the process exits."""
    key = (m.sandbox, m.verify_timeout_s)
    if key not in _TOOLS:
        tools = _TOOLS[key] = SandboxPool(m.sandbox), Verifier(timeout_s=m.verify_timeout_s)
        atexit.register(lambda: [t.close() for t in tools])
    return _TOOLS[key]


class MathTask(hf_policy.HFTask):
    """One run on cfg's problems, sandbox and verifier (`envs.family.Task`)."""

    host = True

    def __init__(self, cfg: TrainConfig):
        m: MathConfig = task_section(cfg, FAMILY)
        self.cfg, self.m = cfg, m
        self.tokenizer = hf_policy.load_tokenizer(m.policy_dir, "task.policy_dir", "trace-jax data math-tiny")
        self.pad_id = self.tokenizer.pad_token_id
        splits = distributed.main_first("math problems", lambda: build_problems(cfg.data_dir, m.problems_dir))
        self.answers: list[str] = []
        self.skipped = 0
        self.train = self._encode(read_problems(cfg.data_dir, m.problems_dir, "train"))
        wanted = m.eval_sets or tuple(s for s in splits if s != "train")
        missing = sorted(set(wanted) - set(splits))
        if missing:
            raise ValueError(f"task.eval_sets names {missing}, not in {m.problems_dir} (it has {splits[1:]})")
        self.evals = {s: self._encode(read_problems(cfg.data_dir, m.problems_dir, s)[: m.eval_problems or None])
                      for s in wanted}
        if len(self.train.ids) == 0:
            raise ValueError(f"no training problem fits task.prompt_len={m.prompt_len}; raise it")
        if self.skipped:
            print(f"math: skipped {self.skipped} problems longer than task.prompt_len={m.prompt_len} tokens")
        self.sandbox, self.verifier = shared_tools(m)
        self.env = MathEnv(self.tokenizer, self.answers, m, self.sandbox, self.verifier,
                           cache_size(cfg.roots * (1 + cfg.continuations), m.max_turns))
        print(f"math: {len(self.train.ids)} training problems, evaluation sets {list(self.evals)}")

    @property
    def source(self) -> MathConfig:
        return self.m

    @property
    def training(self) -> ProblemSet:
        return self.train

    def _encode(self, rows: list[dict[str, str]]) -> ProblemSet:
        ids, prompts, kept = [], [], []
        for row in rows:
            p = prompt_ids(self.tokenizer, row["problem"])
            if len(p) > self.m.prompt_len:
                self.skipped += 1
                continue
            ids.append(len(self.answers))
            self.answers.append(row["answer"])
            prompts.append(p)
            kept.append(row)
        return ProblemSet(np.asarray(ids, np.int32), *hf_policy.pad_prompts(prompts, self.m.prompt_len, self.pad_id),
                          kept)

    def evaluate(self, model: Policy, step: int, mesh: Mesh | None) -> Evaluation:
        """eval/<set>/{accuracy,tool_calls,no_answer} and their plain average over sets: avg@k accuracy over
        task.eval_samples sampled episodes per problem."""
        cfg, k = self.cfg, self.m.eval_samples
        sampling = SamplingConfig(cfg.temperature, cfg.top_p, cfg.draw)
        key = jax.random.fold_in(jax.random.key(cfg.seed + 7), step)
        metrics, records = {}, []
        for s, (name, ps) in enumerate(self.evals.items()):
            jobs = np.repeat(np.arange(len(ps.ids)), k)  # [n * k]: each problem k times
            prompts = dataclasses.replace(ps, ids=ps.ids[jobs], tokens=ps.tokens[jobs], lengths=ps.lengths[jobs])
            got = []
            for lo, tree in episodes(model, self.env, prompts, cfg.eval_batch, jax.random.fold_in(key, s),
                                     sampling, self.pad_id, mesh, desc=f"eval {name}"):
                texts = responses(tree, self.tokenizer)
                for slot, job in enumerate(range(lo, min(lo + cfg.eval_batch, len(jobs)))):
                    row = ps.rows[jobs[job]]  # every turn but the last ran a code block
                    got.append({"set": name, "id": row["id"], "sample": job % k, "answer": row["answer"],
                                "response": texts[slot], "reward": float(tree.reward[slot]),
                                "tool_calls": max(int(tree.num_turns[slot]) - 1, 0),
                                "answered": answer_of(texts[slot]) is not None})
            records += got
            metrics |= {f"eval/{name}/accuracy": float(np.mean([g["reward"] for g in got])),
                        f"eval/{name}/tool_calls": float(np.mean([g["tool_calls"] for g in got])),
                        f"eval/{name}/no_answer": float(np.mean([not g["answered"] for g in got]))}
        for m in ("accuracy", "tool_calls", "no_answer"):
            metrics[f"eval/average/{m}"] = float(np.mean([metrics[f"eval/{n}/{m}"] for n in self.evals]))
        return Evaluation(metrics=metrics, records={ANSWERS_FILE: records},
                          texts={"eval.md": markdown(metrics, {n: len(p.ids) for n, p in self.evals.items()}, k, step)})


def score_responses(cfg: TrainConfig, path: Path) -> Evaluation:
    """Grades responses produced elsewhere against the evaluation sets' answers, with this family's verifier (no
    policy, no tokenizer): `path` is JSONL, one {"id", "response"} per line ("set" optional where ids repeat
    across sets). Accuracy per set over the lines given; each graded line is a record."""
    m: MathConfig = task_section(cfg, FAMILY)
    splits = build_problems(cfg.data_dir, m.problems_dir)
    answers: dict[tuple[str, str], str] = {}
    for name in m.eval_sets or splits[1:]:
        answers |= {(name, r["id"]): r["answer"] for r in read_problems(cfg.data_dir, m.problems_dir, name)}
    by_id: dict[str, list[str]] = {}
    for name, pid in answers:
        by_id.setdefault(pid, []).append(name)
    lines = []
    for where, row in jsonl_rows(path):
        if not isinstance(row, dict) or not isinstance(row.get("response"), str) or "id" not in row:
            raise ValueError(f'{where}: needs "id" and a string "response"')
        pid, sets = str(row["id"]), by_id.get(str(row["id"]), [])
        name = row.get("set") or (sets[0] if len(sets) == 1 else None)
        if (name, pid) not in answers:
            raise ValueError(f"{where}: problem id {pid!r} " + (
                f"is in several sets {sets}: add \"set\"" if len(sets) > 1 else
                f"is in no evaluation set of {m.problems_dir}" + (f" under set {name!r}" if name else "")))
        lines.append({"set": name, "id": pid, "answer": answers[name, pid], "response": row["response"]})
    with Verifier(timeout_s=m.verify_timeout_s) as verifier:
        rewards = verifier.scores([r["answer"] for r in lines], [r["response"] for r in lines])
    records = [{**r, "reward": v, "answered": answer_of(r["response"]) is not None} for r, v in zip(lines, rewards)]
    metrics = {}
    for name in dict.fromkeys(r["set"] for r in records):
        mine = [r for r in records if r["set"] == name]
        metrics[f"eval/{name}/accuracy"] = float(np.mean([r["reward"] for r in mine]))
        metrics[f"eval/{name}/no_answer"] = float(np.mean([not r["answered"] for r in mine]))
        metrics[f"eval/{name}/responses"] = float(len(mine))
    return Evaluation(metrics=metrics, records={ANSWERS_FILE: records})


def markdown(metrics: dict[str, float], sizes: dict[str, int], k: int, step: int) -> str:
    rows = [f"Step {step}: avg@{k} accuracy (%), tool calls per episode, episodes with no boxed answer (%).", "",
            "| set | problems | accuracy | tool calls | no answer |", "|---|---|---|---|---|"]
    for name in [*sizes, "average"]:
        n = sizes.get(name, sum(sizes.values()))
        rows.append(f"| {name} | {n} | {100 * metrics[f'eval/{name}/accuracy']:.1f} | "
                    f"{metrics[f'eval/{name}/tool_calls']:.2f} | {100 * metrics[f'eval/{name}/no_answer']:.1f} |")
    return "\n".join(rows) + "\n"


def turn_shape(cfg: TrainConfig) -> TurnShape:
    m = task_section(cfg, FAMILY)
    return TurnShape(m.prompt_len, m.max_turns, m.action_len, m.obs_len)


def policy_model(cfg: TrainConfig, preset: str | None = None) -> tuple[ModelConfig, str]:
    """<policy_dir>/config.json as the run loads it (`hf_policy.policy_dims`)."""
    m = task_section(cfg, FAMILY)
    return hf_policy.policy_dims(m.policy_dir, m.dtype, cfg, preset)


def missing_inputs(cfg: TrainConfig) -> list[str]:
    """The tokenizer and the problem files (train, and each evaluation set task.eval_sets names), where missing
    (`Family.missing_inputs`)."""
    m = task_section(cfg, FAMILY)
    root = Path(m.problems_dir)
    missing = hf_policy.missing_tokenizer(m.policy_dir, "task.policy_dir")
    has = lambda name: any(root.joinpath(f"{name}.{f}").is_file() for f in FORMATS)
    if not has("train"):
        missing.append(f"task.problems_dir={root}: train.jsonl (or .json, .parquet), rows with `problem` and `answer`")
    missing += [f"task.problems_dir={root}: eval/{s}.jsonl (or .json, .parquet)" for s in m.eval_sets
                if not has(f"eval/{s}")]
    return missing


FAMILY = Family(name="math", setup=MathTask, turn_shape=turn_shape, policy_model=policy_model, config=MathConfig,
                description="tool-integrated math: ```python blocks run in a sandbox, \\boxed{} graded by math-verify",
                success_metric="eval/average/accuracy", policy_dir="hf", plot_keys=PLOT_KEYS, records=(ANSWERS_FILE,),
                score_responses=score_responses, missing_inputs=missing_inputs)
