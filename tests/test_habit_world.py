"""The habit world's evidence comes from the README's own commands: its contrast measurement (bench contrast, base
built with the habit) and the comparison's PROTOCOL.md, run here at a tiny size; and the committed results folder's
protocol and table are what those commands and the raw metrics give."""

import re
import shlex
from pathlib import Path

import yaml

from trace_jax.cli import main
from trace_jax.compare.config import CompareConfig
from trace_jax.compare.protocol import PROTOCOL_FILE, protocol_text
from trace_jax.compare.summary import markdown_table, summarize
from trace_jax.config import load_config

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs/results/habit"
TINY = ["world.num_entities=64", "world.num_questions=120", "sft.steps=4", "sft.episodes=32", "sft.batch_size=8",
        "sft.warmup_steps=1", "sft.eval_batch=16", "sft.model.hidden_size=32", "sft.model.intermediate_size=64",
        "sft.model.num_layers=1", "sft.model.num_heads=2", "sft.model.num_kv_heads=1", "sft.model.head_dim=16",
        "pool_size=4", "roots=4", "continuations=1", "eval_batch=16", "warmup.batches=2", "warmup.fit_steps=4",
        "predictor_layers=0"]


def readme_command(*words: str) -> list[str]:
    """The README's one `trace-jax ...` command line holding all of `words`, as argv (without `trace-jax`)."""
    lines = [line.split("#")[0].strip() for line in (ROOT / "README.md").read_text().splitlines()]
    found = [line for line in lines if line.startswith("trace-jax ") and all(w in line for w in words)]
    assert len(found) == 1, f"README: {len(found)} command lines hold {words}"
    return shlex.split(found[0])[1:]


def test_the_readme_commands_measure_the_world_and_write_the_protocol(tmp_path, capsys):
    bench = readme_command("bench contrast", "configs/hopworld_habit.yaml")
    base = tmp_path / "base"
    assert main([*bench, *TINY, f"init_checkpoint={base}/checkpoints", f"data_dir={tmp_path / 'tfds'}",
                 "--samples", "3", "--group", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"mixed groups of 2 \(GRPO's effective ratio at G=2\): \d+\.\d%", out), out
    assert "root AUC of a perfect predictor" in out and "warmed-up head" in out
    assert re.search(r"searches the expert's habit misfires on \(facts of the world\) over the other questions alike "
                     r"(\d\.\d{3}|nan)", out), out  # nan: the tiny base solves nothing
    built = yaml.safe_load((base / "config.yaml").read_text())  # the base was built with the world's habit
    assert (built["blind_spot"], built["blind_spot_prob"], built["world"]["num_entities"]) == ("person", 0.8, 64)

    protocol = readme_command("compare", "configs/compare_habit.yaml", "--protocol")
    assert main([*protocol, f"out_dir={tmp_path / 'cmp'}"]) == 0
    written = (tmp_path / "cmp" / PROTOCOL_FILE).read_text()
    assert not (tmp_path / "cmp" / "runs").exists()  # nothing ran
    for fact in ("`trace`: TRACE", "`uniform_tree`: trees", "**Seeds**: 0, 1, 2, fixed", "**Steps**: 100 per run",
                 "blind_spot=person", "at steps 0, 25, 50, 75, 100", "temperature 0.7",
                 "`trace` minus each other method at T*"):
        assert fact in written, fact


def _generated(text: str) -> list[str]:
    """A protocol's lines but its date line and its Deviations section (written by hand)."""
    return [line for line in text.split("## Deviations")[0].splitlines() if not line.startswith("Written by")]


def test_the_committed_protocol_is_the_one_the_command_writes():
    ccfg = load_config(CompareConfig, ROOT / "configs/compare_habit.yaml")
    assert _generated((RESULTS / PROTOCOL_FILE).read_text()) == _generated(protocol_text(ccfg))


def test_the_results_table_is_recomputed_from_the_raw_metrics():
    ccfg = load_config(CompareConfig, ROOT / "configs/compare_habit.yaml")
    seeds = [ccfg.train.seed + k for k in range(ccfg.seeds)]
    summary = summarize(RESULTS, list(ccfg.methods), seeds)
    assert markdown_table(summary) == (RESULTS / "results.md").read_text()
