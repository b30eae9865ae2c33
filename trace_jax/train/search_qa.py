"""RL on search QA: a local HF Qwen3 policy searches a corpus through a retriever (Search-R1 protocol).

Each step: a pool of training questions, the tree rolled out through the host path (`rollout.host`:
stage 1, the turns with one retriever call per turn, stage 2), then targets, advantages, loss and the
optax update as one compiled function (`train.step.build_update`). Evaluation reports EM / F1 / sub-EM
per dataset. At the end the policy is exported as an HF checkpoint with its tokenizer.

Across processes (`trace-jax train --multi-host`) every process holds the questions, places only its rows of
each pool, and its environment calls the retriever for its own slots only; process 0 writes the run's files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import yaml
from flax import nnx
from jax.sharding import Mesh
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from trace_jax import distributed
from trace_jax import sharding as shd
from trace_jax.config import TrainConfig, to_dict
from trace_jax.data.search_qa_prompts import Questions, load_questions
from trace_jax.envs.search_qa.env import SearchQAEnv
from trace_jax.evaluate_qa import averages, evaluate_set, markdown
from trace_jax.memory import check_fits
from trace_jax.metrics import MetricsLogger, plot_metrics, read_metrics, rewind_jsonl
from trace_jax.models import from_pretrained, save_pretrained
from trace_jax.models.qwen3 import Policy, with_predictor_layers
from trace_jax.retrieval.client import RetrieverClient
from trace_jax.rollout.chunks import Chunk, runs_in_chunks
from trace_jax.rollout.expand import Pool
from trace_jax.rollout.schedule import expand_scheduled
from trace_jax.rollout.tree import Tree
from trace_jax.train.checkpoint import check_resume_config, newest_meta, run_checkpoints_dir
from trace_jax.train.chunked import ChunkedStep
from trace_jax.train.loop import (
    ALLOCATION_FILE,
    checkpoint_step,
    equal_cost_budget,
    record_step,
    rollout_sampling,
    run_state,
    step_spec,
    warm_up,
)
from trace_jax.train.preemption import sigterm_stops
from trace_jax.train.step import StepSpec, build_update, rollout_metrics

ANSWERS_FILE = "eval_answers.jsonl"  # one line per evaluated question: {"step", "dataset", "question", "response", ...}
PLOT_KEYS = ("reward", "effective_ratio", "eval/average/em", "eval/average/f1", "predictor_loss", "root_auc",
             "generated_tokens", "tool_calls", "entropy", "utilisation")


def load_tokenizer(policy_dir: str | Path) -> PreTrainedTokenizerBase:
    path = Path(policy_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"search_qa.policy_dir={path} holds no HF checkpoint (config.json); point it at a "
                                "local Qwen3 directory, or write the tiny one with `trace-jax data search-qa-tiny`")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        raise ValueError(f"the tokenizer in {path} has no pad token; set pad_token in its tokenizer_config.json")
    return tokenizer


def setup(cfg: TrainConfig) -> tuple[PreTrainedTokenizerBase, Questions, SearchQAEnv]:
    sq = cfg.search_qa
    tokenizer = load_tokenizer(sq.policy_dir)
    questions = distributed.main_first("search-qa data", lambda: load_questions(sq, cfg.data_dir, tokenizer,
                                                                                 tokenizer.pad_token_id))
    if questions.skipped:
        print(f"search_qa: skipped {questions.skipped} questions longer than prompt_len={sq.prompt_len} tokens")
    env = SearchQAEnv(tokenizer, questions.golds, RetrieverClient(sq.retriever).retrieve, sq)
    return tokenizer, questions, env


def pool_at(cfg: TrainConfig, questions: Questions, step: int, mesh: jax.sharding.Mesh, stream: int = 0) -> Pool:
    """Step `step`'s pool: pool_size training questions drawn from (seed, stream, step) alone, so a resumed run
    (and every process) sees the same pools (stream 1: the predictor warm-up's); rows split over the mesh."""
    train = questions.train
    rows = np.random.default_rng([cfg.seed, stream, step]).choice(len(train.ids), cfg.pool_size,
                                                                  replace=len(train.ids) < cfg.pool_size)
    return shd.rows_on(Pool(tokens=train.tokens[rows], lengths=train.lengths[rows], question=train.ids[rows]), mesh)


def evaluate(model: Policy, env: SearchQAEnv, questions: Questions, cfg: TrainConfig, step: int,
             mesh: jax.sharding.Mesh | None = None) -> tuple[dict[str, float], str, list[dict]]:
    """(eval/<dataset>/<metric> and eval/{average,weighted}/<metric>, the Markdown table, one {"dataset",
    "question", "response", "em", "f1", "sub_em"} per question). mesh: the one the model's parameters are on,
    over whose batch axes each batch's rows are split (None: one device)."""
    sampling = rollout_sampling(cfg)
    key = jax.random.fold_in(jax.random.key(cfg.seed + 7), step)
    per, answers = {}, []
    for i, (d, qs) in enumerate(questions.evals.items()):
        per[d], got = evaluate_set(model, env, qs, cfg.eval_batch, jax.random.fold_in(key, i), sampling,
                                   env.tokenizer.pad_token_id, mesh)
        answers += [{"dataset": d, **a} for a in got]
    sizes = {d: len(qs.ids) for d, qs in questions.evals.items()}
    rows = {**per, **averages(per, sizes)}
    return {f"eval/{d}/{m}": v for d, r in rows.items() for m, v in r.items()}, markdown(per, sizes), answers


def expand_step(model: Policy, env: SearchQAEnv, pool: Pool, key: jax.Array, spec: StepSpec, chunk_slots: int
                ) -> tuple[Tree, jax.Array, dict[str, jax.Array], list[Chunk] | None]:
    """(tree, pool_v, stats, chunks) of one step of `spec` with the environment on the host (`expand_scheduled`)."""
    return expand_scheduled(model, env, pool, key, plan=spec.plan, sampling=spec.sampling, pad_id=spec.pad_id,
                            host=True, chunk_slots=chunk_slots, live_slots=spec.refill_slots, mesh=spec.mesh)


def load_policy(cfg: TrainConfig, mesh: Mesh | None = None) -> Policy:
    """The run's policy: search_qa.policy_dir's weights in float32, computing in search_qa.dtype, with the
    predictor's own layers when predictor_layers asks for them."""
    policy = from_pretrained(cfg.search_qa.policy_dir, compute_dtype=cfg.search_qa.dtype, mesh=mesh)
    return with_predictor_layers(policy, cfg.predictor_layers)


def train_search_qa(cfg: TrainConfig, resume: bool = False, allow_config_change: bool = False,
                    on_log: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, float]:
    """RL on search QA (see the module docstring); on_log as in `train.loop.train`."""
    out = Path(cfg.out_dir)
    if resume:
        checked, meta = newest_meta(run_checkpoints_dir(cfg))
        check_resume_config(cfg, checked, meta["config"], allow_config_change)
    tokenizer, questions, env = setup(cfg)
    main = distributed.is_main()  # the process that writes the run's files (every process checkpoints)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    mesh = shd.make_mesh(cfg.mesh)
    check_fits(cfg, mesh)  # before the weights load: fails naming the bytes when the step cannot fit the devices
    model = load_policy(cfg, mesh)
    pad_id = tokenizer.pad_token_id
    warmup = {} if resume else warm_up(cfg, model, env, lambda i: pool_at(cfg, questions, i, mesh, stream=1), pad_id,
                                       host=True)  # a resumed state already holds the warmed-up head
    graphdef, params = nnx.split(model)
    tx, state, ckpts, start, budget = run_state(cfg, params, checked if resume else None, allow_config_change)
    if budget is None:
        def probe(spec):
            pool = pool_at(cfg, questions, 0, mesh)
            tree, _, stats, _ = expand_step(model, env, pool, jax.random.key(cfg.seed + 1), spec, cfg.chunk_slots)
            return shd.to_host(rollout_metrics(tree, pool, stats))

        budget = equal_cost_budget(cfg, probe, pad_id, mesh)
    spec = step_spec(cfg, budget, pad_id, mesh)
    update = build_update(graphdef, tx, spec)
    chunked = ChunkedStep(graphdef, tx, spec, cfg.chunk_slots) if runs_in_chunks(spec.plan, cfg.chunk_slots) else None
    key = jax.random.key(cfg.seed)
    print(f"train: search_qa, {cfg.allocator}, pool B={cfg.pool_size}, roots M={budget.roots}, continuations "
          f"N={budget.continuations}, group G={budget.group_size}, {len(questions.train.ids)} training questions, "
          f"retriever {cfg.search_qa.retriever.url}, mesh {dict(mesh.shape)}")
    for name in (ALLOCATION_FILE, ANSWERS_FILE) if main else ():  # like metrics.jsonl: a fresh run starts anew
        rewind_jsonl(out / name, start if resume else -1)
    last: dict[str, float] = {}

    def log_eval(step: int, metrics: dict[str, float]) -> None:
        scores, table, answers = evaluate(nnx.merge(graphdef, state.params), env, questions, cfg, step, mesh)
        metrics.update(scores)
        for answer in answers:
            log.append(ANSWERS_FILE, {"step": step, **answer})
        if main:
            (out / "eval.md").write_text(f"Step {step}: one sampled episode per question (%).\n\n{table}")
            tqdm.write(f"train: step {step} evaluation\n{table}")

    with MetricsLogger(out, resume_from_step=start if resume else None, active=main, on_log=on_log) as log, \
            sigterm_stops() as stop_requested:
        if start == 0:
            first = dict(warmup)
            log_eval(0, first)
            log.log(0, first)
        bar = tqdm(range(start + 1, cfg.steps + 1), desc=f"train {cfg.allocator}", initial=start, total=cfg.steps,
                   disable=not main)
        for step in bar:
            t0 = time.perf_counter()
            pool = pool_at(cfg, questions, step, mesh)
            tree, pool_v, stats, chunks = expand_step(nnx.merge(graphdef, state.params), env, pool,
                                                      jax.random.fold_in(key, step), spec, cfg.chunk_slots)
            rollout_s = time.perf_counter() - t0
            if chunked is None:
                state, metrics = update(state, tree, pool, pool_v, stats)
            else:
                state, metrics = chunked.update(state, chunks, tree, pool, pool_v, stats)
            last = record_step(log, step, metrics)
            last["step_seconds"], last["rollout_seconds"] = time.perf_counter() - t0, rollout_s
            if step % cfg.eval_every == 0 or step == cfg.steps:
                log_eval(step, last)
            log.log(step, last)
            bar.set_postfix(reward=f"{last['reward']:.2f}", eff=f"{last['effective_ratio']:.2f}")
            checkpoint_step(cfg, ckpts, step, state, {"step": step, **budget._asdict(), "config": to_dict(cfg)},
                            distributed.any_process(stop_requested()))
    ckpts.close()
    hf_dir = out / "hf"  # loads in transformers (Qwen3ForCausalLM) and back here with from_pretrained
    save_pretrained(nnx.merge(graphdef, state.params), hf_dir)  # every process gathers, process 0 writes
    if not main:
        return last
    tokenizer.save_pretrained(hf_dir)
    logged = {k for row in read_metrics(out) for k in row}
    plot = plot_metrics(out, keys=[k for k in PLOT_KEYS if k in logged])
    print(f"train: metrics {out / 'metrics.jsonl'}, plot {plot}, checkpoints {ckpts.directory}, HF policy {hf_dir}")
    return last
