"""BFCL v4 multi-turn function calling as a task family (`env: bfcl`; settings: the run's `task:` section,
`BfclConfig`).

Each step's tree is rolled out through the host path: every live slot's assistant message is run on its episode's
own API instances (`env.BfclEnv`, forks restoring their anchor's state), and the update runs compiled. Evaluation
plays one episode per evaluation entry and reports bfcl's verdict (the terminal reward) as accuracy per subset and
overall; each entry's calls, as BFCL call strings per user turn per step, and its verdict go to a JSONL file. Call
sequences produced elsewhere are scored through the same episode logic (`trace-jax eval --calls FILE.jsonl`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from trace_jax import distributed
from trace_jax.config import TrainConfig
from trace_jax.envs import hf_policy
from trace_jax.envs.bfcl.apis import Apis
from trace_jax.envs.bfcl.calls import Call, parse_call_string
from trace_jax.envs.bfcl.chat import DONE, assistant_messages
from trace_jax.envs.bfcl.config import BfclConfig
from trace_jax.envs.bfcl.data import Entry, load_entries
from trace_jax.envs.bfcl.dataset import build_entries, read_entries
from trace_jax.envs.bfcl.env import BfclEnv
from trace_jax.envs.bfcl.episode import Episode, Reference, reference
from trace_jax.envs.family import Evaluation, Family, TurnShape, jsonl_rows, task_section
from trace_jax.evaluate_qa import episodes
from trace_jax.models.config import ModelConfig
from trace_jax.models.qwen3 import Policy
from trace_jax.rollout.engine import SamplingConfig, past_actions

CALLS_FILE = "eval_calls.jsonl"  # one line per entry: {"step", "subset", "id", "calls", "reward", "failure"}
SPLIT_FILE = "split.json"  # <out_dir>/split.json: {"seed", "train": [ids], "eval": [ids]} of the run's entries
PLOT_KEYS = ("reward", "effective_ratio", "eval/overall/accuracy", "predictor_loss", "root_auc",
             "generated_tokens", "tool_calls", "entropy", "utilisation")


@dataclasses.dataclass(frozen=True)
class EntrySet:
    """Entries with question ids `ids` [n] (indices into the env's entries) and their prompts."""

    ids: np.ndarray  # [n] int32
    tokens: np.ndarray  # [n, P] int32, right-padded
    lengths: np.ndarray  # [n] int32
    entries: list[Entry]


def selected(m: BfclConfig, data_dir: str, split: str, by_id: dict[str, Entry]) -> list[Entry]:
    """The entries of one split that task.subsets and task.entry_ids select, in the package's order."""
    wanted = set(m.entry_ids)
    return [by_id[r["id"]] for r in read_entries(data_dir, m.split_seed, split)
            if r["subset"] in m.subsets and (not wanted or r["id"] in wanted)]


class BfclTask(hf_policy.HFTask):
    """One run on cfg's BFCL entries (`envs.family.Task`)."""

    host = True

    def __init__(self, cfg: TrainConfig):
        m: BfclConfig = task_section(cfg, FAMILY)
        self.cfg, self.m = cfg, m
        self.tokenizer = hf_policy.load_tokenizer(m.policy_dir, "task.policy_dir", "trace-jax data bfcl-tiny")
        if not self.tokenizer.chat_template:
            raise ValueError(f"the tokenizer in task.policy_dir={m.policy_dir} has no chat template; a Qwen3 "
                             "checkpoint brings one (set chat_template in its tokenizer_config.json)")
        self.pad_id = self.tokenizer.pad_token_id
        distributed.main_first("bfcl entries", lambda: build_entries(cfg.data_dir, m.split_seed))
        by_id = {e.id: e for e in load_entries(m.subsets)}
        train = selected(m, cfg.data_dir, "train", by_id)
        evaluate = selected(m, cfg.data_dir, "eval", by_id)
        if m.eval_entries:
            evaluate = [e for s in m.subsets for e in [e for e in evaluate if e.subset == s][: m.eval_entries]]
        self.env = BfclEnv(self.tokenizer, train + evaluate, m.max_turns, m.action_len, m.obs_len, m.cache_size,
                           m.decoding)
        self.skipped = 0
        self.train = self._encode(0, train)
        self.evals = self._encode(len(train), evaluate)
        if len(self.train.ids) == 0:
            raise ValueError(f"no training entry fits task.prompt_len={m.prompt_len} (or task.entry_ids selects "
                             "none of the training side); raise it")
        if self.skipped:
            print(f"bfcl: skipped {self.skipped} entries longer than task.prompt_len={m.prompt_len} tokens")
        if distributed.is_main():
            out = Path(cfg.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / SPLIT_FILE).write_text(json.dumps({"seed": m.split_seed, "train": [e.id for e in train],
                                                      "eval": [e.id for e in evaluate]}, indent=1) + "\n")
        print(f"bfcl: {len(self.train.ids)} training entries, {len(self.evals.ids)} evaluation entries")

    @property
    def source(self) -> BfclConfig:
        return self.m

    @property
    def training(self) -> EntrySet:
        return self.train

    def _encode(self, first: int, entries: list[Entry]) -> EntrySet:
        ids, prompts, kept = [], [], []
        for q, entry in enumerate(entries, first):
            p = self.env.prompt_ids(q)
            if len(p) > self.m.prompt_len:
                self.skipped += 1
                continue
            ids.append(q)
            prompts.append(p)
            kept.append(entry)
        return EntrySet(np.asarray(ids, np.int32), *hf_policy.pad_prompts(prompts, self.m.prompt_len, self.pad_id),
                        kept)

    def evaluate(self, model: Policy, step: int, mesh: Mesh | None) -> Evaluation:
        """eval/<subset>/accuracy and eval/overall/accuracy: bfcl's verdict on one sampled episode per entry."""
        cfg, es = self.cfg, self.evals
        sampling = SamplingConfig(cfg.temperature, cfg.top_p, cfg.draw)
        key = jax.random.fold_in(jax.random.key(cfg.seed + 7), step)
        records = []
        for lo, tree in episodes(model, self.env, es, cfg.eval_batch, key, sampling, self.pad_id, mesh,
                                 desc="eval bfcl"):
            t = jax.device_get(tree)
            actions = past_actions(t.tokens, t.policy_mask, t.prompt_len, t.boundaries, t.num_turns,
                                   np.ones(t.num_slots, bool))  # [slot][turn] the policy's token ids
            for slot, row in enumerate(range(lo, min(lo + cfg.eval_batch, len(es.ids)))):
                texts = self.tokenizer.batch_decode([a.tolist() for a in actions[slot]], skip_special_tokens=True)
                episode = replay(es.entries[row], texts, self.env.reference(int(es.ids[row])), self.m.decoding)
                records.append(record(es.entries[row], episode, float(t.reward[slot])))
        metrics = accuracies(records)
        return Evaluation(metrics=metrics, records={CALLS_FILE: records},
                          texts={"eval.md": markdown(metrics, step, self.m.decoding)})


def replay(entry: Entry, texts: list[str], ref: Reference, decoding: str = "bfcl") -> Episode:
    """The text-level episode of `entry` after the assistant messages `texts` (stopping when it is done), checked
    against its ground truth `ref`, their calls read as `decoding` says."""
    episode = Episode.start(entry, decoding)
    for text in texts:
        if episode.step(text, entry, ref).done:
            break
    return episode


def record(entry: Entry, episode: Episode, reward: float) -> dict:
    """One entry's line: its calls (turn -> step -> BFCL call strings), bfcl's verdict and the first failed check."""
    failure = episode.failure if episode.done else "the episode did not finish"
    return {"subset": entry.subset, "id": entry.id, "calls": episode.calls, "reward": reward, "failure": failure}


def accuracies(records: list[dict]) -> dict[str, float]:
    """eval/<subset>/{accuracy,entries} and eval/overall/{accuracy,entries} over `records`."""
    metrics = {}
    for subset in dict.fromkeys(r["subset"] for r in records):
        mine = [r["reward"] for r in records if r["subset"] == subset]
        metrics |= {f"eval/{subset}/accuracy": float(np.mean(mine)), f"eval/{subset}/entries": float(len(mine))}
    metrics["eval/overall/accuracy"] = float(np.mean([r["reward"] for r in records])) if records else 0.0
    metrics["eval/overall/entries"] = float(len(records))
    return metrics


DECODED = {"bfcl": "calls decoded as bfcl's Qwen handler decodes them",
           "lenient": "calls decoded leniently (task.decoding=lenient: not bfcl's figure for these outputs)"}


def markdown(metrics: dict[str, float], step: int, decoding: str) -> str:
    rows = [f"Step {step}: bfcl multi-turn accuracy (%), one episode per entry, {DECODED[decoding]}.", "",
            "| subset | entries | accuracy |", "|---|---|---|"]
    for name in [k.split("/")[1] for k in metrics if k.endswith("/accuracy")]:
        rows.append(f"| {name} | {int(metrics[f'eval/{name}/entries'])} | "
                    f"{100 * metrics[f'eval/{name}/accuracy']:.1f} |")
    return "\n".join(rows) + "\n"


def _call(binder: Apis, text: str, where: str) -> Call:
    """A call string as the Call a policy would have sent: bound by its method's signature where the name is one,
    else by its keywords (it then gets the episode's error result, as in bfcl)."""
    try:
        return binder.bind(text)
    except ValueError:
        try:
            name, _, kwargs = parse_call_string(text)
        except ValueError as e:
            raise ValueError(f"{where}: {text!r} is not a BFCL call string name(arg=value, ...): {e}") from None
        return Call(name, kwargs)


def score_calls(cfg: TrainConfig, path: Path) -> Evaluation:
    """Scores call sequences produced elsewhere (no policy, no tokenizer) through the episode logic and bfcl's
    checks: `path` is JSONL, one {"id": entry id, "calls": [[[call strings of step 1], [step 2], ...] per user
    turn]} per line (bfcl's decoded multi_turn result). Each step is one assistant message making its calls; a turn
    ends with a message without calls. Accuracy per subset and overall over the lines given."""
    m: BfclConfig = task_section(cfg, FAMILY)
    by_id = {e.id: e for e in load_entries(m.subsets)}
    records = []
    for where, row in jsonl_rows(path):
        turns = row.get("calls") if isinstance(row, dict) else None
        if "id" not in row or not isinstance(turns, list) or not all(
                isinstance(t, list) and all(isinstance(s, list) and all(isinstance(c, str) for c in s) for s in t)
                for t in turns):
            raise ValueError(f'{where}: needs "id" and "calls", a list per user turn of lists per step of call '
                             "strings")
        entry = by_id.get(str(row["id"]))
        if entry is None:
            raise ValueError(f"{where}: entry id {row['id']!r} is in no subset of task.subsets={list(m.subsets)}")
        binder = Apis.of(entry)
        texts = assistant_messages([[[_call(binder, c, where) for c in step] for step in turn] for turn in turns])
        texts += [DONE] * (len(entry.turns) - len(turns))  # turns the file leaves out: answered without calls
        episode = replay(entry, texts, reference(entry))
        records.append(record(entry, episode, float(episode.done and episode.failure is None)))
    return Evaluation(metrics=accuracies(records), records={CALLS_FILE: records})


def turn_shape(cfg: TrainConfig) -> TurnShape:
    m = task_section(cfg, FAMILY)
    return TurnShape(m.prompt_len, m.max_turns, m.action_len, m.obs_len)


def policy_model(cfg: TrainConfig, preset: str | None = None) -> tuple[ModelConfig, str]:
    """<policy_dir>/config.json as the run loads it (`hf_policy.policy_dims`)."""
    m = task_section(cfg, FAMILY)
    return hf_policy.policy_dims(m.policy_dir, m.dtype, cfg, preset)


def missing_inputs(cfg: TrainConfig) -> list[str]:
    """The tokenizer, where missing (`Family.missing_inputs`); the entries come with bfcl-eval."""
    return hf_policy.missing_tokenizer(task_section(cfg, FAMILY).policy_dir, "task.policy_dir")


FAMILY = Family(name="bfcl", setup=BfclTask, turn_shape=turn_shape, policy_model=policy_model, config=BfclConfig,
                description="BFCL v4 multi-turn function calling: Qwen3 tool calls on stateful APIs, bfcl's checker",
                success_metric="eval/overall/accuracy", policy_dir="hf", plot_keys=PLOT_KEYS, records=(CALLS_FILE,),
                score_responses=score_calls, missing_inputs=missing_inputs)
