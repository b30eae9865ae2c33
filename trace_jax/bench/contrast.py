"""`trace-jax bench contrast`: how much contrast a world leaves for an allocator, and how much a predictor can know.

The base policy (the run's `init_checkpoint`, built when missing) plays K sampled episodes of every test
question. Printed:
- success per hop count;
- the share of questions whose first G episodes are mixed: GRPO's effective ratio at group size G on prompts
  drawn uniformly (the paper's math setting: 26.8% at G = 8);
- the root AUC of a perfect predictor of each question's success rate (the ceiling for any predictor that reads
  the prompt), from a beta-binomial fit of the questions' K episodes; and three predictors one can compute: the
  question's empirical success over the other K - 1 episodes (below that ceiling: a noisy estimate of the rate),
  its hop count's success rate, and its form's (start entity type and relation path: what the text shows without
  the world's facts) success over the other questions of that form; and, when the SFT expert had a blind-spot habit
  (`sft.blind_spot`), the success over the other questions that share its form and the facts the habit meets on its
  chain (`habit_misfires`): what a predictor knowing those facts of the world could reach;
- ceilings for the prefix AUC (turn nodes: the state after each non-final turn): the success rate, over the other
  K - 1 episodes of every question, of the node's state in the world (hop count, turns taken, and how many entities
  of the question's chain the retrieved documents have reached in order). A predictor that reads the history can
  know that state exactly;
- with the predictor warm-up of the config applied, the head's root and prefix AUC for the same held-out episodes;
- with `--probes`, the prefix AUC of probes of the frozen base policy on the turn nodes of every fourth question,
  fitted on the other questions' turn nodes (so, like the head, they are scored on questions they were not fitted
  on): a logistic regression on the hidden state after each layer at the node's read position, one on all layers
  at once, and a one-hidden-layer MLP on all layers: how much of the knowable state a read of the base policy holds;
  and a predictor with features of its own (the policy's `predictor_layers: 1`: a trainable copy of the top layer
  over the frozen layers below, fitted as the warm-up fits it) fitted on the same questions' episodes: its prefix AUC
  on the held-out questions and on the questions it was fitted on (how much of what it learns carries to new
  prompts); and the same fitted on every training question's episodes (ten times the prompts), scored on the test
  questions'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from trace_jax.config import TrainConfig
from trace_jax.envs.hopworld import protocol, reference
from trace_jax.envs.hopworld.config import ENTITY_TYPES
from trace_jax.envs.hopworld.world import World
from trace_jax.evaluate import rollout_questions, success_by_hops
from trace_jax.models.qwen3 import Policy, with_predictor_layers
from trace_jax.objectives import auc
from trace_jax.rollout.tree import Tree
from trace_jax.train.warmup import Episodes, episode_values, fit_own_layers, select


def contrast_figures(reward: np.ndarray, hops: np.ndarray, group: int, labels: dict[str, np.ndarray] | None = None
                     ) -> dict[str, float]:
    """From outcomes reward [Q, K] bool (K episodes of Q questions) and hops [Q]: success_hop{h}, mixed_at_group over
    the first `group` episodes, the root AUC of the last episode's outcome for the question's success over the first
    K - 1 and for its hop count's rate over them, and `true_rate_auc` over all K (auc_true_rate, rate_beta_a/b) with
    its bootstrap standard error over questions (auc_true_rate_se). For each labelling name -> [Q] in `labels`
    (questions of one label read alike to some predictor), auc_{name}_rate: for the success over the first K - 1
    episodes of the *other* questions of its label (`form_rates`; the overall rate for a label of one question)."""
    seen, held = reward[:, :-1], reward[:, -1]
    every = jnp.ones(len(reward), bool)
    by_hops = success_by_hops(seen.reshape(-1), np.repeat(hops, seen.shape[1]))
    out = {k: v for k, v in by_hops.items() if k.startswith("success_hop")}
    first = reward[:, :group]
    out["mixed_at_group"] = float((first.any(1) & ~first.all(1)).mean())
    out["auc_question_mean"] = float(auc(jnp.asarray(seen.mean(1)), jnp.asarray(held), every))
    out["auc_hop_rate"] = float(auc(jnp.asarray([by_hops[f"success_hop{h}"] for h in hops]), jnp.asarray(held), every))
    for name, labelling in (labels or {}).items():
        out[f"auc_{name}_rate"] = float(auc(jnp.asarray(form_rates(seen, labelling)), jnp.asarray(held), every))
    out["auc_true_rate"], out["rate_beta_a"], out["rate_beta_b"] = true_rate_auc(reward)
    rng = np.random.default_rng(0)  # its standard error: the fit again on questions drawn with replacement
    out["auc_true_rate_se"] = float(np.std([true_rate_auc(reward[rng.integers(0, len(reward), len(reward))])[0]
                                            for _ in range(100)]))
    return out


def form_rates(seen: np.ndarray, forms: np.ndarray) -> np.ndarray:
    """[Q] each question's form's success over the episodes seen [Q, K'] of the other questions of that form."""
    wins = np.bincount(forms, seen.sum(1))  # per form
    counts = np.bincount(forms) * seen.shape[1]
    others_wins, others = wins[forms] - seen.sum(1), counts[forms] - seen.shape[1]
    return np.where(others > 0, others_wins / np.maximum(others, 1), seen.mean())


def question_forms(world: World, questions: np.ndarray) -> np.ndarray:
    """[Q] labels of what a question's text shows without the world's facts: its start entity's type and its
    relation path."""
    keys = [(int(world.entity_types[world.question_starts[q]]), *world.question_paths[q].tolist()) for q in questions]
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return np.array([index[k] for k in keys])


def habit_misfires(world: World, questions: np.ndarray, blind_type: int) -> np.ndarray:
    """[Q, 2] int: the world's facts that the SFT expert's blind-spot habit (`sft.blind_spot`) meets on each question's
    chain: whether a search by the first piece of the start entity's name returns another entity's document, and how
    many of the later searched entities (all but the answer) such a search would miss the same way."""
    def misses(entity: int) -> bool:
        name = world.name_ids(entity)
        return bool(world.entity_types[entity] == blind_type and len(name) > 1
                    and reference.retrieve(world, name[:1]) != entity)

    searched = [world.chain(q)[:-1] for q in questions.tolist()]
    return np.array([(misses(c[0]), sum(misses(e) for e in c[1:])) for c in searched], np.int64).reshape(-1, 2)


def misfire_forms(world: World, questions: np.ndarray, blind_type: int) -> np.ndarray:
    """[Q] labels of a question's form (`question_forms`) joined with its `habit_misfires`: a predictor that knows
    every fact the habit meets reads questions of one label alike."""
    keys = np.concatenate([question_forms(world, questions)[:, None], habit_misfires(world, questions, blind_type)], 1)
    return np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)


def true_rate_auc(reward: np.ndarray) -> tuple[float, float, float]:
    """(auc, a, b) from outcomes reward [Q, K] bool: the root AUC of a predictor that knows each question's success
    rate p exactly, with p ~ Beta(a, b) fitted by maximum likelihood to the questions' success counts out of K
    (beta-binomial): the chance that the p of a random success exceeds the p of a random failure (ties half),
    whose densities are p Beta(p; a, b) and (1 - p) Beta(p; a, b) up to normalisation."""
    from scipy import optimize, special

    k = reward.shape[1]
    wins = np.arange(k + 1)
    questions = np.bincount(reward.sum(1), minlength=k + 1)  # [K + 1] questions with 0..K successes

    def nll(x: np.ndarray) -> float:  # the beta-binomial log-likelihood, less the binomial coefficients
        a, b = np.exp(x)
        return -questions @ (special.betaln(wins + a, k - wins + b) - special.betaln(a, b))

    a, b = np.exp(optimize.minimize(nll, np.zeros(2), method="Nelder-Mead").x)
    p = (np.arange(20_000) + 0.5) / 20_000
    log_density = (a - 1) * np.log(p) + (b - 1) * np.log1p(-p)
    density = np.exp(log_density - log_density.max())
    pos, neg = p * density, (1 - p) * density
    pos, neg = pos / pos.sum(), neg / neg.sum()
    return float(np.sum(pos * (np.cumsum(neg) - neg / 2))), float(a), float(b)


def chain_progress(tree: Tree, world: World) -> np.ndarray:
    """[S, T] int32: after turn t of each (root) slot, how many entities of its question's chain (start, then each
    hop's target) the documents retrieved so far reach in order; -1 for turns not taken. Read off the observations:
    a turn's document is the last `<information> ... </information>` span before its boundary."""
    doc_entity = {tuple(world.doc_ids(e)): e for e in range(world.num_entities)}
    s, turns = tree.boundaries.shape
    out = np.full((s, turns), -1, np.int32)
    for i in range(s):
        chain = world.chain(int(tree.question[i]))
        seen, start = set(), int(tree.prompt_len[i])
        for t in range(int(tree.num_turns[i])):
            end = int(tree.boundaries[i, t])
            span = tree.tokens[i, start:end].tolist()
            start = end
            if protocol.INFO in span and protocol.INFO_END in span[span.index(protocol.INFO):]:
                opened = len(span) - 1 - span[::-1].index(protocol.INFO)
                closed = opened + span[opened:].index(protocol.INFO_END)
                seen.add(doc_entity.get(tuple(span[opened + 1 : closed]), -1))
            reached = 0
            while reached < len(chain) and chain[reached] in seen:
                reached += 1
            out[i, t] = reached
    return out


def prefix_states(tree: Tree, world: World) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slot [K], turn [K], state [K, 3]) of every prefix node: the boundary after each non-final turn t of a slot;
    state = (hops, t, chain progress)."""
    progress = chain_progress(tree, world)
    slot, turn = np.nonzero(np.arange(tree.max_turns)[None, :] < np.asarray(tree.num_turns)[:, None] - 1)
    hops = np.asarray(world.hops)[np.asarray(tree.question)[slot]]
    return slot, turn, np.stack([hops, turn, progress[slot, turn]], axis=1)


def state_rate_auc(states: np.ndarray, won: np.ndarray, held: np.ndarray) -> float:
    """AUC over the held [K] nodes of the success rate of their state ([K, F] int), estimated from the other nodes;
    a state never seen outside held-out nodes scores the overall rate."""
    keys = [tuple(r) for r in states.tolist()]
    fit = {}
    for k, w in zip((k for k, h in zip(keys, held) if not h), won[~held]):
        n, s = fit.get(k, (0, 0.0))
        fit[k] = (n + 1, s + float(w))
    base = float(won[~held].mean())
    rate = np.array([fit[k][1] / fit[k][0] if k in fit else base for k, h in zip(keys, held) if h])
    return float(auc(jnp.asarray(rate), jnp.asarray(won[held]), jnp.ones(len(rate), bool)))


@nnx.jit
def layer_reads(model: Policy, tokens: jax.Array, positions: jax.Array) -> jax.Array:
    """[S, layers, P, D] float32 hidden state after each layer (the last one normed: what the success head reads)
    at positions [S, P] of tokens [S, L], from one causal forward."""
    rows, length = tokens.shape
    where = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (rows, length))
    x = jnp.take(model.embed_tokens[...], tokens, axis=0).astype(model.cfg.jnp_dtype)
    reads = []
    for i, layer in enumerate(model.layers):
        x, _ = layer(x, where, None, None)
        h = model.norm(x) if i == len(model.layers) - 1 else x
        reads.append(jnp.take_along_axis(h, positions[..., None], axis=1))
    return jnp.stack(reads, axis=1).astype(jnp.float32)


def probe_auc(x: np.ndarray, won: np.ndarray, held: np.ndarray, hidden: int = 0, steps: int = 1000,
              learning_rate: float = 1e-2, weight_decay: float = 1e-4) -> float:
    """AUC on the held [K] rows of a probe of features x [K, F] for won [K], fitted on the other rows by full-batch
    AdamW on the log loss over standardised features: a logistic regression (hidden = 0) or a one-hidden-layer GELU
    MLP of `hidden` units."""
    fit = jnp.asarray(x[~held])
    mean, scale = fit.mean(0), fit.std(0) + 1e-6
    norm = lambda v: (jnp.asarray(v) - mean) / scale
    f = x.shape[1]
    params = {"w": jnp.zeros(hidden or f), "b": jnp.zeros(())}
    if hidden:
        params |= {"w1": jax.random.normal(jax.random.key(0), (f, hidden)) / np.sqrt(f), "b1": jnp.zeros(hidden)}

    def logit(p, v):
        return (jax.nn.gelu(v @ p["w1"] + p["b1"]) if hidden else v) @ p["w"] + p["b"]

    tx, y = optax.adamw(learning_rate, weight_decay=weight_decay), jnp.asarray(won[~held], jnp.float32)
    loss = lambda p, v: jnp.mean(optax.sigmoid_binary_cross_entropy(logit(p, v), y))

    @jax.jit
    def train(p, v):
        def body(carry, _):
            p, state = carry
            updates, state = tx.update(jax.grad(loss)(p, v), state, p)
            return (optax.apply_updates(p, updates), state), None

        return jax.lax.scan(body, (p, tx.init(p)), None, length=steps)[0][0]

    score = logit(train(params, norm(fit)), norm(x[held]))
    return float(auc(score, jnp.asarray(won[held]), jnp.ones(int(held.sum()), bool)))


def probe_report(model: Policy, tree: Tree, slot: np.ndarray, turn: np.ndarray, won: np.ndarray, held: np.ndarray,
                 batch: int) -> dict[str, float]:
    """prefix_auc_probe_layer{l}, prefix_auc_probe_all, prefix_auc_probe_mlp: `probe_auc` of the turn nodes (slot,
    turn [K]) from the hidden states at their read positions, fitted on the nodes not held [K]."""
    reads = np.asarray(tree.read_positions())
    per_slot = np.concatenate([np.asarray(layer_reads(model, jnp.asarray(tree.tokens[i:i + batch]),
                                                      jnp.asarray(reads[i:i + batch])))
                               for i in range(0, len(reads), batch)])  # [S, layers, T+1, D]
    x = per_slot[slot, :, turn + 1]  # [K, layers, D]
    out = {f"prefix_auc_probe_layer{i + 1}": probe_auc(x[:, i], won, held) for i in range(x.shape[1])}
    every = x.reshape(len(x), -1)
    out["prefix_auc_probe_all"] = probe_auc(every, won, held)
    out["prefix_auc_probe_mlp"] = probe_auc(every, won, held, hidden=256, weight_decay=1e-2)
    return out


TOWER_TRAIN_EPISODES = 2  # episodes of each training question when the tower is fitted on the training split


def tower_report(base: Policy, tree: Tree, held: np.ndarray, batch: int, steps: int = 800, rows: int = 16,
                 learning_rate: float = 1e-3) -> dict[str, float]:
    """root_auc_tower, prefix_auc_tower (the held [S] slots), prefix_auc_tower_fit (the others): `base` with one
    predictor layer of its own (`with_predictor_layers`; `base` is left as it is), fitted by `fit_own_layers` on the
    log loss of every node of the other slots (prompt and non-final turns) against its episode's outcome, `steps`
    minibatches of `rows` slots."""
    if base.cfg.predictor_layers:
        raise ValueError(f"the contrast bench fits a predictor layer of its own over a plain policy, and the base "
                         f"policy has {base.cfg.predictor_layers}: point init_checkpoint at an SFT base")
    tower = with_predictor_layers(base, 1)
    reads = np.asarray(tree.read_positions())  # [S, T+1]
    won = np.asarray(tree.reward, np.float32)
    nodes = np.arange(reads.shape[1])[None, :] < np.asarray(tree.num_turns)[:, None]  # [S, T+1]
    episodes = Episodes(tokens=np.asarray(tree.tokens), reads=reads, target=np.repeat(won[:, None], reads.shape[1], 1),
                        weight=nodes.astype(np.float32), outcome=won, question=np.arange(len(won), dtype=np.int32),
                        slot=np.arange(len(won), dtype=np.int32))
    fit_own_layers(tower, select(episodes, ~held), steps, learning_rate, rows, batch=batch)
    score = episode_values(tower, episodes, batch)  # [S, T+1] V~
    root = np.broadcast_to(np.arange(reads.shape[1]) == 0, nodes.shape)
    prefix = nodes & ~root
    won_nodes = np.broadcast_to(won[:, None] > 0.5, nodes.shape)

    def area(mask: np.ndarray) -> float:
        return float(auc(jnp.asarray(score[mask]), jnp.asarray(won_nodes[mask]), jnp.ones(int(mask.sum()), bool)))

    return {"root_auc_tower": area(root & held[:, None]), "prefix_auc_tower": area(prefix & held[:, None]),
            "prefix_auc_tower_fit": area(prefix & ~held[:, None])}


def contrast_report(cfg: TrainConfig, samples: int, group: int, warmup: bool = True, probes: bool = False,
                    tower_steps: int = 800) -> dict[str, float]:
    """The figures above as a dict: success_hop{h}, mixed_at_group, auc_question_mean, auc_hop_rate, auc_form_rate,
    auc_misfire_rate (with sft.blind_spot), prefix_auc_state, prefix_nodes, auc_head and prefix_auc_head (after the
    warm-up; absent when warmup is False), and `probe_report`'s prefix_auc_probe_* and `tower_report`'s figures
    after tower_steps minibatches (probes: True)."""
    from trace_jax.envs.hopworld.family import HopWorldTask, base_policy, split_question_ids
    from trace_jax.train.loop import rollout_sampling, warm_up
    from trace_jax.train.warmup import read_hidden

    if samples < group + 1 or group < 2:
        raise ValueError(f"need group >= 2 and samples >= group + 1 (one held-out episode), got group={group}, "
                         f"samples={samples}")
    task = HopWorldTask(cfg)
    env = task.env
    base = base_policy(cfg)
    model = with_predictor_layers(base, cfg.predictor_layers)
    questions = task.questions
    sampling = rollout_sampling(cfg)
    tree = rollout_questions(model, env, np.repeat(questions, samples), cfg.eval_batch, jax.random.key(cfg.seed + 11),
                             sampling)
    reward = np.asarray(tree.reward).reshape(len(questions), samples) > 0.5
    labels = {"form": question_forms(env.world, questions)}
    if cfg.sft.blind_spot:  # what a predictor that knows the facts the habit meets could reach
        labels["misfire"] = misfire_forms(env.world, questions, ENTITY_TYPES.index(cfg.sft.blind_spot))
    out = contrast_figures(reward, np.asarray(env.world.hops)[questions], group, labels)
    slot, turn, states = prefix_states(tree, env.world)
    held = slot % samples == samples - 1  # the held-out episode of each question (slots are question-major)
    won = np.asarray(tree.reward)[slot] > 0.5
    out["prefix_auc_state"] = state_rate_auc(states, won, held)
    out["prefix_nodes"] = int(held.sum())
    if probes:  # before the warm-up: the base policy as it is
        quarter = np.arange(len(tree.reward)) // samples % 4 == 0  # [S] the probes' held-out questions' slots
        out |= probe_report(model, tree, slot, turn, won, quarter[slot], cfg.eval_batch)
        out["prefix_auc_state_quarter"] = state_rate_auc(states, won, quarter[slot])
        out |= tower_report(base, tree, quarter, cfg.eval_batch, steps=tower_steps)
        out["tower_steps"] = tower_steps
        # the same fit on many more prompts: every training question's episodes, scored on the test questions'
        train_q = split_question_ids(cfg, "train")
        fitted = rollout_questions(model, env, np.repeat(train_q, TOWER_TRAIN_EPISODES), cfg.eval_batch,
                                   jax.random.key(cfg.seed + 12), sampling)
        both = jax.tree.map(lambda a, b: np.concatenate([a, b]), fitted, tree)
        wide = tower_report(base, both, np.arange(len(both.reward)) >= len(fitted.reward), cfg.eval_batch,
                            steps=tower_steps)
        out |= {f"{k}_train_split": v for k, v in wide.items()}
        out["tower_train_questions"] = len(train_q)
    if warmup and cfg.warmup.batches:
        warm_up(cfg, model, env, lambda i: task.warmup_pool(i, None), task.pad_id)
        rows = np.arange(len(questions)) * samples + samples - 1  # each question's held-out episode
        reads, b = np.asarray(tree.read_positions())[rows], cfg.eval_batch
        v = np.concatenate([np.asarray(model.success_from_hidden(read_hidden(model, tree.tokens[rows[i:i + b]],
                                                                             reads[i:i + b])))
                            for i in range(0, len(rows), b)])  # [questions, T+1] V~ of each node
        every = jnp.ones(len(questions), bool)
        out["auc_head"] = float(auc(jnp.asarray(v[:, 0]), jnp.asarray(reward[:, -1]), every))
        head = v[slot[held] // samples, turn[held] + 1]
        out["prefix_auc_head"] = float(auc(jnp.asarray(head), jnp.asarray(won[held]), jnp.ones(len(head), bool)))
    return out


def run_contrast_bench(cfg: TrainConfig, samples: int, group: int, probes: bool = False, tower_steps: int = 800
                       ) -> dict[str, float]:
    r = contrast_report(cfg, samples, group, probes=probes, tower_steps=tower_steps)
    hops = [k for k in r if k.startswith("success_hop")]
    print(f"base policy {cfg.init_checkpoint}, {samples} episodes per test question at temperature {cfg.temperature}")
    print("success per hop: " + ", ".join(f"{k[len('success_hop'):]}: {100 * r[k]:.1f}%" for k in hops))
    print(f"mixed groups of {group} (GRPO's effective ratio at G={group}): {100 * r['mixed_at_group']:.1f}%")
    a, b = r["rate_beta_a"], r["rate_beta_b"]
    print(f"root AUC of a perfect predictor of each question's success rate {r['auc_true_rate']:.3f} ± "
          f"{r['auc_true_rate_se']:.3f} (rates ~ "
          f"Beta({a:.2f}, {b:.2f}): mean {a / (a + b):.3f}, std {np.sqrt(a * b / (a + b + 1)) / (a + b):.3f})")
    print(f"root AUC for a held-out episode: question's success over {samples - 1} others "
          f"{r['auc_question_mean']:.3f}, hop count's success rate {r['auc_hop_rate']:.3f}, its form's (start type "
          f"and relations) over the other questions of that form {r['auc_form_rate']:.3f}"
          + (f", its form and which of its chain's searches the expert's habit misfires on (facts of the world) over "
             f"the other questions alike {r['auc_misfire_rate']:.3f}" if "auc_misfire_rate" in r else "")
          + (f", warmed-up head {r['auc_head']:.3f}" if "auc_head" in r else ""))
    print(f"prefix AUC over {r['prefix_nodes']} turn nodes of the held-out episodes: success rate of the node's state "
          f"(hops, turn, chain entities reached) {r['prefix_auc_state']:.3f}"
          + (f", warmed-up head {r['prefix_auc_head']:.3f}" if "prefix_auc_head" in r else ""))
    if probes:
        layers = sorted(k for k in r if k.startswith("prefix_auc_probe_layer"))
        print("prefix AUC of probes of the base policy on the turn nodes of a quarter of the questions, fitted on "
              "the others': "
              + ", ".join(f"layer {k[len('prefix_auc_probe_layer'):]} {r[k]:.3f}" for k in layers)
              + f", all layers {r['prefix_auc_probe_all']:.3f}, MLP on all layers {r['prefix_auc_probe_mlp']:.3f}")
        print(f"a trainable copy of the top layer over the frozen others, fitted on the others' episodes "
              f"({r['tower_steps']} minibatches): prefix AUC {r['prefix_auc_tower']:.3f} on the held-out quarter "
              f"({r['prefix_auc_tower_fit']:.3f} on the questions it was fitted on), "
              f"root AUC {r['root_auc_tower']:.3f}; "
              f"the turn nodes' world state scores {r['prefix_auc_state_quarter']:.3f} on that quarter")
        print(f"the same fitted on the training split's {r['tower_train_questions']} questions x "
              f"{TOWER_TRAIN_EPISODES} episodes: prefix AUC {r['prefix_auc_tower_train_split']:.3f} on the test "
              f"questions' episodes "
              f"({r['prefix_auc_tower_fit_train_split']:.3f} on the training questions'), "
              f"root AUC {r['root_auc_tower_train_split']:.3f}")
    return r
