"""`trace-jax bench contrast`: how much contrast a world leaves for an allocator, and how much a predictor can know.

The base policy (the run's `init_checkpoint`, built when missing) plays K sampled episodes of every test
question. Printed:
- success per hop count;
- the share of questions whose first G episodes are mixed: GRPO's effective ratio at group size G on prompts
  drawn uniformly (the paper's math setting: 26.8% at G = 8);
- ceilings for the root AUC of any predictor of a new episode's outcome: the question's empirical success
  over the other K - 1 episodes, and its hop count's success rate;
- with the predictor warm-up of the config applied, the head's root AUC for the same held-out episodes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from trace_jax.config import TrainConfig
from trace_jax.data.hopworld_tfds import build_dataset
from trace_jax.envs.hopworld import build_world
from trace_jax.envs.hopworld.env import HopWorldEnv
from trace_jax.evaluate import question_pool, rollout_questions, success_by_hops
from trace_jax.objectives import auc
from trace_jax.rollout.engine import SamplingConfig


def contrast_figures(reward: np.ndarray, hops: np.ndarray, group: int) -> dict[str, float]:
    """From outcomes reward [Q, K] bool (K episodes of Q questions) and hops [Q]: success_hop{h} and the root-AUC
    ceilings over the first K - 1 episodes, and mixed_at_group over the first `group` episodes."""
    seen, held = reward[:, :-1], reward[:, -1]
    every = jnp.ones(len(reward), bool)
    by_hops = success_by_hops(seen.reshape(-1), np.repeat(hops, seen.shape[1]))
    out = {k: v for k, v in by_hops.items() if k.startswith("success_hop")}
    first = reward[:, :group]
    out["mixed_at_group"] = float((first.any(1) & ~first.all(1)).mean())
    out["auc_question_mean"] = float(auc(jnp.asarray(seen.mean(1)), jnp.asarray(held), every))
    out["auc_hop_rate"] = float(auc(jnp.asarray([by_hops[f"success_hop{h}"] for h in hops]), jnp.asarray(held), every))
    return out


def contrast_report(cfg: TrainConfig, samples: int, group: int, warmup: bool = True) -> dict[str, float]:
    """The figures above as a dict: success_hop{h}, mixed_at_group, auc_question_mean, auc_hop_rate,
    auc_head (after the warm-up; absent when warmup is False)."""
    from trace_jax.train.loop import base_policy, held_out_questions, warm_up

    if samples < group + 1 or group < 2:
        raise ValueError(f"need group >= 2 and samples >= group + 1 (one held-out episode), got group={group}, "
                         f"samples={samples}")
    build_dataset(cfg.data_dir, cfg.world)
    env = HopWorldEnv(build_world(cfg.world), cfg.world)
    model = base_policy(cfg)
    questions = held_out_questions(cfg)
    sampling = SamplingConfig(cfg.temperature, cfg.top_p)
    tree = rollout_questions(model, env, np.repeat(questions, samples), cfg.eval_batch, jax.random.key(cfg.seed + 11),
                             sampling)
    reward = np.asarray(tree.reward).reshape(len(questions), samples) > 0.5
    out = contrast_figures(reward, np.asarray(env.world.hops)[questions], group)
    if warmup and cfg.warmup.batches:
        warm_up(cfg, model, env)
        pool = question_pool(env, questions)
        hidden = model(pool.tokens).hidden  # [questions, P, D]: the prompt read is at its last token
        v = model.success_from_hidden(hidden[jnp.arange(len(questions)), pool.lengths - 1])
        out["auc_head"] = float(auc(v, jnp.asarray(reward[:, -1]), jnp.ones(len(questions), bool)))
    return out


def run_contrast_bench(cfg: TrainConfig, samples: int, group: int) -> dict[str, float]:
    r = contrast_report(cfg, samples, group)
    hops = [k for k in r if k.startswith("success_hop")]
    print(f"base policy {cfg.init_checkpoint}, {samples} episodes per test question at temperature {cfg.temperature}")
    print("success per hop: " + ", ".join(f"{k[len('success_hop'):]}: {100 * r[k]:.1f}%" for k in hops))
    print(f"mixed groups of {group} (GRPO's effective ratio at G={group}): {100 * r['mixed_at_group']:.1f}%")
    print(f"root AUC for a held-out episode: question's success over {samples - 1} others "
          f"{r['auc_question_mean']:.3f}, hop count's success rate {r['auc_hop_rate']:.3f}"
          + (f", warmed-up head {r['auc_head']:.3f}" if "auc_head" in r else ""))
    return r
