"""Evaluation harness: sampled success of the policy on a split, overall and per hop count."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from tqdm.auto import tqdm

from trace_jax import sharding as shd
from trace_jax.envs.hopworld import HopWorldConfig, World, protocol
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.models.qwen3 import Policy
from trace_jax.objectives import calibration_report, ece_floor, node_targets, predictor_report, reliability_bins
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool, rollout_prompts
from trace_jax.rollout.tree import Tree


def prompts(env: HopWorldEnv, question_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded chat prompts [N, P] and their lengths [N] for HopWorld questions."""
    rows = [protocol.prompt_ids(env.world.question_ids(int(q))) for q in question_ids]
    return protocol.pad_rows(rows, env.cfg.prompt_len)


def question_pool(env: HopWorldEnv, question_ids: Sequence[int]) -> Pool:
    """A rollout pool of HopWorld questions: their padded prompts, lengths and ids."""
    ids, lens = prompts(env, question_ids)
    return Pool(tokens=jnp.asarray(ids), lengths=jnp.asarray(lens), question=jnp.asarray(question_ids, jnp.int32))


def rollout_questions(model: Policy, env: HopWorldEnv, question_ids: Sequence[int], batch: int, key: jax.Array,
                      sampling: SamplingConfig, progress: bool = True, mesh: Mesh | None = None) -> Tree:
    """One sampled episode per question, as one host-side tree of N slots (`prompt` = row index); mesh: each
    batch's slots split over its data axes."""
    question_ids = np.asarray(question_ids, np.int32)
    parts = []
    for i, lo in enumerate(tqdm(range(0, len(question_ids), batch), desc="eval", leave=False,
                                disable=not progress)):
        n = min(batch, len(question_ids) - lo)
        pad = batch - n  # fixed slot count: one compilation; padded slots repeat row 0, ignored
        rows = np.concatenate([np.arange(lo, lo + n), np.full(pad, lo)])
        tree = rollout_prompts(model, env, question_pool(env, question_ids[rows]), jax.random.fold_in(key, i),
                               sampling=sampling, pad_id=protocol.PAD, mesh=mesh)
        tree = jax.tree.map(lambda x, n=n: x[:n], shd.to_host(tree))
        parts.append(dataclasses.replace(tree, prompt=tree.prompt + lo))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def success_by_hops(reward: np.ndarray, hops: np.ndarray) -> dict[str, float]:
    """{'success': mean, 'success_hop{h}': mean over questions of h hops, ...} of rewards [N]."""
    out = {"success": float(reward.mean())}
    for h in sorted(set(hops.tolist())):
        out[f"success_hop{h}"] = float(reward[hops == h].mean())
    return out


@functools.partial(jax.jit, static_argnames="bins")
def _predictor_arrays(tree: Tree, bins: int) -> tuple[dict[str, jax.Array], dict[str, tuple[jax.Array, ...]]]:
    """`predictor_quality`'s arrays, in one program over one computation of the node targets (eagerly, each small op
    would compile on its own)."""
    targets, weight = node_targets(tree)
    pred = jnp.clip(tree.success, 0.0, 1.0)
    parts = (("root", slice(0, 1)), ("prefix", slice(1, None)))
    diagram = {name: reliability_bins(pred[:, cols], targets[:, cols], weight[:, cols], bins) for name, cols in parts}
    floors = {f"{name}_ece_floor": ece_floor(pred[:, cols], weight[:, cols], jax.random.key(0), bins=bins)
              for name, cols in parts}
    return calibration_report(pred, targets, weight, bins) | predictor_report(tree) | floors, diagram


def predictor_quality(tree: Tree, bins: int = 10) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """V~ on single-episode rollouts, against each slot's outcome: (AUC, Brier and ECE for the prompt reads
    (root_*) and the turn reads (prefix_*), the ECE a perfectly calibrated V~ would show on these nodes from sampling
    noise alone (root_ece_floor, prefix_ece_floor: `objectives.ece_floor`), and the spread of the prompt reads
    (root_v_std); the reliability-diagram bins of the prompt reads ("root") and turn reads ("prefix"))."""
    scores, diagram = _predictor_arrays(jax.tree.map(jnp.asarray, tree), bins)
    root_v = np.clip(np.asarray(tree.success[:, 0]), 0.0, 1.0)[np.asarray(tree.has_reading[:, 0])]
    scores = {k: float(v) for k, v in scores.items()} | {"root_v_std": float(root_v.std())}
    return scores, {name: {"count": count.tolist(), "pred": mean_pred.tolist(), "target": mean_target.tolist()}
                    for name, (count, mean_pred, mean_target) in diagram.items()}


def hop_success(model: Policy, env: HopWorldEnv, question_ids: Sequence[int], batch: int,
                key: jax.Array, sampling: SamplingConfig, progress: bool = True) -> dict[str, float]:
    """One sampled episode per question; returns {'success': mean, 'success_hop{h}': mean, ...}."""
    tree = rollout_questions(model, env, question_ids, batch, key, sampling, progress)
    return success_by_hops(tree.reward, np.asarray(env.world.hops)[np.asarray(question_ids)])


def render_sampled(model: Policy, world: World, cfg: HopWorldConfig, question: int, seed: int) -> str:
    """Text of one sampled episode (temperature 1) of `model` on a HopWorld question, turn by turn."""
    from trace_jax.envs.hopworld import vocab

    env = HopWorldEnv(world, cfg)
    tree = jax.device_get(rollout_prompts(model, env, question_pool(env, [question]), jax.random.key(seed),
                                          sampling=SamplingConfig(), pad_id=protocol.PAD))
    tokens, mask, start = tree.tokens[0].tolist(), tree.policy_mask[0], int(tree.prompt_len[0])
    lines = [vocab.decode(tokens[:start])]
    for end in tree.boundaries[0, : tree.num_turns[0]].tolist():
        n_act = int(mask[start:end].sum())
        lines.append(vocab.decode(tokens[start:start + n_act]))
        if end > start + n_act:
            lines.append(vocab.decode(tokens[start + n_act:end]))
        start = end
    lines.append(f"reward: {float(tree.reward[0])}  (answer: {world.answer_text(question)})")
    return "\n".join(lines)
