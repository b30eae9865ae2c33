"""Search QA evaluation: one sampled episode per question, EM / F1 / sub-EM per dataset, and the two
averages papers report (plain mean over datasets, and weighted by test size)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import jax
import numpy as np
from jax.sharding import Mesh
from tqdm.auto import tqdm

from trace_jax import sharding as shd
from trace_jax.allocation import one_episode_per_prompt
from trace_jax.data.search_qa_prompts import QuestionSet
from trace_jax.envs.base import HostEnv
from trace_jax.envs.search_qa.answers import score
from trace_jax.envs.search_qa.env import SearchQAEnv
from trace_jax.envs.search_qa.protocol import parse_action
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool
from trace_jax.rollout.host import expand_host
from trace_jax.rollout.tree import Tree


class Prompts(Protocol):
    """Prompts of an environment's questions: a `QuestionSet`, the math family's `ProblemSet`."""

    ids: np.ndarray  # [n] int32 question ids
    tokens: np.ndarray  # [n, P] int32, right-padded
    lengths: np.ndarray  # [n] int32

METRICS = ("em", "f1", "sub_em")


def responses(tree: Tree, tokenizer) -> list[str]:
    """The policy's own tokens of each slot (observations left out), decoded: what evaluation logs."""
    tokens, mask = np.asarray(tree.tokens), np.asarray(tree.policy_mask)
    return tokenizer.batch_decode([t[m].tolist() for t, m in zip(tokens, mask)], skip_special_tokens=True)


def final_turns(tree: Tree, tokenizer) -> list[str]:
    """The policy's tokens of each slot's last turn, decoded as the environment decodes an action: the turn whose
    `<answer>` it rewarded ("" for a slot with no turn)."""
    tokens, mask = np.asarray(tree.tokens), np.asarray(tree.policy_mask)
    turns, bounds, prompt = np.asarray(tree.num_turns), np.asarray(tree.boundaries), np.asarray(tree.prompt_len)
    rows = np.arange(len(turns))
    start = np.where(turns >= 2, bounds[rows, np.maximum(turns - 2, 0)], prompt)
    end = np.where(turns >= 1, bounds[rows, np.maximum(turns - 1, 0)], prompt)
    return tokenizer.batch_decode([t[a:b][m[a:b]].tolist() for t, m, a, b in zip(tokens, mask, start, end)],
                                  skip_special_tokens=True)


def episodes(model: Policy, env: HostEnv, prompts: Prompts, batch: int, key: jax.Array, sampling: SamplingConfig,
             pad_id: int, mesh: Mesh | None = None, desc: str = "eval") -> Iterator[tuple[int, Tree]]:
    """One sampled episode per row of `prompts` (tokens [n, P], lengths [n], ids [n] of the environment's
    questions), in fixed-size batches (one compilation; the last batch repeats its last row, to be ignored): per
    batch, (its first row lo, its tree on the host), whose slot s played row lo + s with key fold_in(key, batch).
    mesh: each batch's rows are split over its batch axes (each process's environment answers its own rows)."""
    plan, n = one_episode_per_prompt(batch), len(prompts.ids)
    for i, lo in enumerate(tqdm(range(0, n, batch), desc=desc, leave=False, disable=jax.process_index() > 0)):
        rows = np.minimum(np.arange(lo, lo + batch), n - 1)
        pool = shd.rows_on(Pool(tokens=prompts.tokens[rows], lengths=prompts.lengths[rows],
                                question=prompts.ids[rows]), mesh)
        tree, _, _ = expand_host(model, env, pool, jax.random.fold_in(key, i), plan=plan, sampling=sampling,
                                 pad_id=pad_id, mesh=mesh)
        yield lo, shd.to_host(tree)


def evaluate_set(model: Policy, env: SearchQAEnv, questions: QuestionSet, batch: int, key: jax.Array,
                 sampling: SamplingConfig, pad_id: int, mesh: Mesh | None = None
                 ) -> tuple[dict[str, float], list[dict]]:
    """(mean EM, F1 and sub-EM over the set, one {"question", "response", "em", "f1", "sub_em", "reward"} per
    question; em is the reward the environment gave the episode): one
    episode per question, in fixed-size batches (one compilation). mesh: each batch's rows are split over its batch
    axes (each process's environment answers its own rows)."""
    totals = dict.fromkeys(METRICS, 0.0)
    answers = []
    n = len(questions.ids)
    for lo, tree in episodes(model, env, questions, batch, key, sampling, pad_id, mesh):
        texts, finals = responses(tree, env.tokenizer), final_turns(tree, env.tokenizer)
        for slot in range(min(batch, n - lo)):  # slot s plays row lo + s
            question = int(questions.ids[lo + slot])
            action = parse_action(finals[slot])
            scores = score(action.content if action.kind == "answer" else None, env.golds[question])
            for k, v in scores.items():
                totals[k] += v
            answers.append({"question": question, "response": texts[slot], **scores,
                            "reward": float(tree.reward[slot])})
    return {k: v / max(n, 1) for k, v in totals.items()}, answers


def averages(per_dataset: dict[str, dict[str, float]], sizes: dict[str, int]) -> dict[str, dict[str, float]]:
    """{"average": plain mean over datasets, "weighted": mean weighted by each dataset's question count}."""
    total = max(sum(sizes.values()), 1)
    return {"average": {m: float(np.mean([r[m] for r in per_dataset.values()])) for m in METRICS},
            "weighted": {m: sum(r[m] * sizes[d] for d, r in per_dataset.items()) / total for m in METRICS}}


def markdown(per_dataset: dict[str, dict[str, float]], sizes: dict[str, int]) -> str:
    rows = ["| dataset | questions | EM | F1 | sub-EM |", "|---|---|---|---|---|"]
    for d, r in {**per_dataset, **averages(per_dataset, sizes)}.items():
        n = sizes.get(d, sum(sizes.values()))
        rows.append(f"| {d} | {n} | " + " | ".join(f"{100 * r[m]:.1f}" for m in METRICS) + " |")
    return "\n".join(rows) + "\n"
