"""Evaluation harness: sampled success of the policy on a split, overall and per hop count."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from trace_jax.envs.hopworld import HopWorldConfig, World, protocol
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import Pool, rollout_prompts


def prompts(env: HopWorldEnv, question_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded chat prompts [N, P] and their lengths [N] for HopWorld questions."""
    rows = [protocol.prompt_ids(env.world.question_ids(int(q))) for q in question_ids]
    return protocol.pad_rows(rows, env.cfg.prompt_len)


def question_pool(env: HopWorldEnv, question_ids: Sequence[int]) -> Pool:
    """A rollout pool of HopWorld questions: their padded prompts, lengths and ids."""
    ids, lens = prompts(env, question_ids)
    return Pool(tokens=jnp.asarray(ids), lengths=jnp.asarray(lens), question=jnp.asarray(question_ids, jnp.int32))


def hop_success(model: Policy, env: HopWorldEnv, question_ids: Sequence[int], batch: int,
                key: jax.Array, sampling: SamplingConfig, progress: bool = True) -> dict[str, float]:
    """One sampled episode per question; returns {'success': mean, 'success_hop{h}': mean, ...}."""
    question_ids = np.asarray(question_ids, np.int32)
    rewards = []
    for i, lo in enumerate(tqdm(range(0, len(question_ids), batch), desc="eval", leave=False,
                                disable=not progress)):
        n = min(batch, len(question_ids) - lo)
        pad = batch - n  # fixed slot count: one compilation; padded slots repeat row 0, ignored
        rows = np.concatenate([np.arange(lo, lo + n), np.full(pad, lo)])
        tree = rollout_prompts(model, env, question_pool(env, question_ids[rows]), jax.random.fold_in(key, i),
                               sampling=sampling, pad_id=protocol.PAD)
        rewards.append(np.asarray(tree.reward)[:n])
    rewards = np.concatenate(rewards)
    hops = np.asarray(env.world.hops)[question_ids]
    out = {"success": float(rewards.mean())}
    for h in sorted(set(hops.tolist())):
        out[f"success_hop{h}"] = float(rewards[hops == h].mean())
    return out


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
