"""Search QA as a task family: a local HF Qwen3 policy searches a corpus through a retriever (Search-R1 protocol).

Each step's tree is rolled out through the host path (`rollout.host`: one retriever call per turn for all live
slots), then the update runs compiled. Evaluation reports EM / F1 / sub-EM per dataset with both averages; the
trained policy is saved as an HF checkpoint with its tokenizer. Settings: the run's `search_qa:` section.

Across processes (`trace-jax train --multi-host`) every process holds the questions, places only its rows of
each pool, and its environment calls the retriever for its own slots only; process 0 writes the run's files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
from jax.sharding import Mesh

from trace_jax import distributed
from trace_jax.config import TrainConfig
from trace_jax.data.search_qa_prompts import Questions, QuestionSet, load_questions
from trace_jax.data.search_qa_tfds import FORMATS
from trace_jax.envs import hf_policy
from trace_jax.envs.family import Evaluation, Family, TurnShape
from trace_jax.envs.search_qa.config import SearchQAConfig
from trace_jax.envs.search_qa.env import SearchQAEnv
from trace_jax.evaluate_qa import averages, evaluate_set, markdown
from trace_jax.models.config import ModelConfig
from trace_jax.models.qwen3 import Policy
from trace_jax.retrieval.client import RetrieverClient, RetrieverError
from trace_jax.rollout.engine import SamplingConfig

ANSWERS_FILE = "eval_answers.jsonl"  # one line per evaluated question: {"step", "dataset", "question", "response", ...}
PLOT_KEYS = ("reward", "effective_ratio", "eval/average/em", "eval/average/f1", "predictor_loss", "root_auc",
             "generated_tokens", "tool_calls", "entropy", "utilisation")


def load_policy(cfg: TrainConfig, mesh: Mesh | None = None) -> Policy:
    """The run's policy: search_qa.policy_dir's weights in float32, computing in search_qa.dtype, with the
    predictor's own layers when predictor_layers asks for them."""
    return hf_policy.load_policy(cfg.search_qa.policy_dir, cfg.search_qa.dtype, cfg.predictor_layers, mesh)


def evaluate(model: Policy, env: SearchQAEnv, questions: Questions, cfg: TrainConfig, step: int,
             mesh: Mesh | None = None) -> Evaluation:
    """eval/<dataset>/<metric> and eval/{average,weighted}/<metric>; records: one {"dataset", "question",
    "response", "em", "f1", "sub_em"} per question (ANSWERS_FILE); texts: the Markdown table (eval.md). mesh: the
    one the model's parameters are on, over whose batch axes each batch's rows are split (None: one device)."""
    sampling = SamplingConfig(cfg.temperature, cfg.top_p, cfg.draw)
    key = jax.random.fold_in(jax.random.key(cfg.seed + 7), step)
    per, answers = {}, []
    for i, (d, qs) in enumerate(questions.evals.items()):
        per[d], got = evaluate_set(model, env, qs, cfg.eval_batch, jax.random.fold_in(key, i), sampling,
                                   env.tokenizer.pad_token_id, mesh)
        answers += [{"dataset": d, **a} for a in got]
    sizes = {d: len(qs.ids) for d, qs in questions.evals.items()}
    rows = {**per, **averages(per, sizes)}
    table = f"Step {step}: one sampled episode per question (%).\n\n{markdown(per, sizes)}"
    return Evaluation(metrics={f"eval/{d}/{m}": v for d, r in rows.items() for m, v in r.items()},
                      records={ANSWERS_FILE: answers}, texts={"eval.md": table})


class SearchQATask(hf_policy.HFTask):
    """One run on cfg's search QA data and retriever (`envs.family.Task`)."""

    host = True

    def __init__(self, cfg: TrainConfig):
        sq = self.sq = cfg.search_qa
        self.cfg = cfg
        self.tokenizer = hf_policy.load_tokenizer(sq.policy_dir, "search_qa.policy_dir",
                                                  "trace-jax data search-qa-tiny")
        self.pad_id = self.tokenizer.pad_token_id
        self.questions = distributed.main_first("search-qa data", lambda: load_questions(
            sq, cfg.data_dir, self.tokenizer, self.pad_id))
        if self.questions.skipped:
            print(f"search_qa: skipped {self.questions.skipped} questions longer than prompt_len={sq.prompt_len} "
                  "tokens")
        self.env = SearchQAEnv(self.tokenizer, self.questions.golds, RetrieverClient(sq.retriever).retrieve, sq)
        print(f"search_qa: {len(self.questions.train.ids)} training questions, retriever {sq.retriever.url}")

    @property
    def source(self) -> SearchQAConfig:
        return self.sq

    @property
    def training(self) -> QuestionSet:
        return self.questions.train

    def base_policy(self, mesh: Mesh | None) -> Policy:
        return load_policy(self.cfg, mesh)

    def evaluate(self, model: Policy, step: int, mesh: Mesh | None) -> Evaluation:
        return evaluate(model, self.env, self.questions, self.cfg, step, mesh)


def turn_shape(cfg: TrainConfig) -> TurnShape:
    q = cfg.search_qa
    return TurnShape(q.prompt_len, q.max_turns, q.action_len, q.obs_len)


def policy_model(cfg: TrainConfig, preset: str | None = None) -> tuple[ModelConfig, str]:
    """<policy_dir>/config.json as the run loads it (`hf_policy.policy_dims`)."""
    return hf_policy.policy_dims(cfg.search_qa.policy_dir, cfg.search_qa.dtype, cfg, preset)


def missing_inputs(cfg: TrainConfig) -> list[str]:
    """The tokenizer, the QA files (each training dataset's train split, each evaluated one's test or dev) and a
    retriever that answers, where missing (`Family.missing_inputs`)."""
    sq, qa = cfg.search_qa, Path(cfg.search_qa.qa_dir)
    missing = hf_policy.missing_tokenizer(sq.policy_dir, "search_qa.policy_dir")
    has = lambda dataset, *splits: any((qa / dataset / f"{s}.{f}").is_file() for s in splits for f in FORMATS)
    missing += [f"search_qa.qa_dir={qa}: {d}/train.jsonl (or .parquet)" for d in sq.train_datasets
                if not has(d, "train")]
    missing += [f"search_qa.qa_dir={qa}: {d}/test.jsonl or {d}/dev.jsonl (or .parquet)" for d in sq.eval_datasets
                if not has(d, "test", "dev")]
    try:
        RetrieverClient(dataclasses.replace(sq.retriever, retries=0, cache_dir=None)).retrieve(["who wrote hamlet"])
    except RetrieverError as e:
        missing.append(f"search_qa.retriever.url={sq.retriever.url}: a retriever answering there ({e})")
    return missing


FAMILY = Family(name="search_qa", setup=SearchQATask, turn_shape=turn_shape, policy_model=policy_model,
                description="Search-R1's multi-hop QA: an HF Qwen3 policy and a /retrieve server (host tool)",
                success_metric="eval/average/em", policy_dir="hf", plot_keys=PLOT_KEYS,
                records=(ANSWERS_FILE,), missing_inputs=missing_inputs)
