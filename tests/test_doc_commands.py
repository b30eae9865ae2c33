"""Every command the README and the docs show (their ```bash blocks) is held to what it says, as written:

- quick ones (help, memory plans, a comparison's protocol, the dataset build) run here as written, in a folder of
  their own that holds the repository's configs;
- long ones (training, comparisons, SFT, kits, evaluations of a trained run: minutes to hours on a CPU) parse as
  written, and their config with its overrides loads and passes the checks `train` makes before any work; each kind
  is run end to end at tiny sizes by the test LONG names;
- those that need a cloud account and hardware (`launch/*.sh`) run as written with `--dry-run`, which prints the
  cloud commands instead of running them (tests/test_launch.py checks those commands);
- installs (`pip install`, `bash launch/local.sh`) are what CI itself runs.

A command added to a page that fits none of these fails here, as does one that no longer parses."""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from trace_jax.cli import QUICK_COMPARE, build_parser, main

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "launch" / "README.md"]
QUICK = {("--help",), ("plan-memory",), ("data", "build"), ("config-reference",)}  # run as written
# the long commands' kinds, each with the test that runs it end to end at tiny sizes
LONG = {
    ("train",): "tests/train/test_train.py::test_sigkill_then_resume_reproduces_the_uninterrupted_run",
    ("compare",): "tests/test_compare.py::test_quick_compare_end_to_end_from_raw_metrics",
    ("sft",): "tests/test_sft.py::test_sft_reduces_loss_and_checkpoint_reloads",
    ("eval",): "tests/math_family/test_math_train.py::test_trace_steps_resume_exactly_after_a_kill_and_evaluate",
    ("show-tree",): "tests/test_task_family.py::test_the_counter_family_trains_evaluates_shows_its_tree_and_plans_memory",
    ("export",): "tests/test_cli.py::test_export_writes_a_transformers_checkpoint",
    ("data", "show"): "tests/test_cli.py::test_data_show_renders_expert_and_policy_episodes",
    ("data", "search-qa-tiny"): "tests/conftest.py::kit",
    ("data", "math-tiny"): "tests/math_family/conftest.py::math_kit",
    ("data", "bfcl-tiny"): "tests/bfcl/conftest.py::bfcl_kit",
    ("retrieve", "serve"): "tests/retrieval/test_retrieve_cli.py::test_index_then_serve_a_corpus",
    ("bench", "contrast"): "tests/test_habit_world.py::test_the_readme_commands_measure_the_world_and_write_the_protocol",
    ("bench", "retriever"): "tests/test_bench.py::test_retriever_bench_runs",
    ("bench", "host"): "tests/test_bench.py::test_host_bench_runs",
}
SETUP = ("pip install", "bash launch/local.sh")  # CI runs these (.ci/run)


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for each command of each page's ```bash blocks: lines joined at a trailing backslash,
    comments dropped, `a && b` and `a; b` split, a trailing `&` dropped, `[optional parts]` left out, `$i` as 0."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s#\s.*$|^\s*#.*$", "", line)  # a comment (never inside a command here)
                line = re.sub(r"\s\[[^\]]*\]", "", line).replace("$i", "0")
                for part in re.split(r"&&|;|\s&(?:\s|$)", line):
                    command = re.sub(r"^\s*(?:for .* in .*|done|do|wait)\b\s*", "", part).strip()
                    if command:
                        found.append((str(page.relative_to(ROOT)), command))
    return found


COMMANDS = shown_commands()


def words(command: str) -> list[str]:
    """The command's words, an environment assignment before them dropped."""
    argv = shlex.split(command)
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        argv.pop(0)
    return argv


def cli(command: str) -> list[str] | None:
    """The arguments after `trace-jax` of a `trace-jax` command, else None."""
    argv = words(command)
    return argv[1:] if argv[0] == "trace-jax" else None


def setup(command: str) -> bool:
    return " ".join(words(command)).startswith(SETUP)


CLI = [(page, command) for page, command in COMMANDS if cli(command) is not None]
LAUNCH = [(page, command) for page, command in COMMANDS if command.startswith("bash launch/") and not setup(command)]


def kind(argv: list[str]) -> tuple[str, ...]:
    for n in (2, 1):
        if tuple(argv[:n]) in QUICK | set(LONG):
            return tuple(argv[:n])
    raise AssertionError(f"`trace-jax {' '.join(argv)}` is of no kind this test knows: add it to QUICK (cheap: run "
                         "as written) or LONG (with the test that runs it end to end)")


def test_every_page_shows_commands_of_a_known_kind():
    assert len(COMMANDS) > 50 and any(page == "README.md" for page, _ in COMMANDS)
    for page, command in COMMANDS:
        if setup(command):
            continue
        assert (page, command) in CLI + LAUNCH, (page, command)
        if cli(command) is not None:
            kind(cli(command))


def test_the_named_end_to_end_tests_exist():
    for node in LONG.values():
        path, name = node.split("::")
        assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), node  # a test or fixture


def _checked(argv: list[str]) -> None:
    """What the command checks before any work: its arguments, its config with the overrides, the family's checks."""
    from trace_jax.compare.config import CompareConfig
    from trace_jax.config import SFTConfig, TrainConfig, load_config
    from trace_jax.envs.registry import check_family

    args = build_parser().parse_args(argv)
    if not hasattr(args, "overrides"):
        return
    if args.command == "compare":
        load_config(CompareConfig, args.config, (QUICK_COMPARE if args.quick else []) + list(args.overrides))
    elif args.command in ("sft", "data"):
        load_config(SFTConfig, args.config, args.overrides)
    else:
        check_family(load_config(TrainConfig, args.config, args.overrides))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder of its own holding the repository's configs and launch scripts, as a user's checkout does."""
    for name in ("configs", "launch"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("page,command", CLI, ids=[f"{p}:{c[:60]}" for p, c in CLI])
def test_a_shown_command_runs_or_passes_its_checks(page, command, workdir, capsys):
    argv = cli(command)
    if kind(argv) in QUICK:
        with pytest.raises(SystemExit) if argv == ["--help"] else contextlib.nullcontext():
            assert main(argv) == 0, capsys.readouterr().err
    else:
        _checked(argv)


@pytest.mark.parametrize("page,command", LAUNCH, ids=[f"{p}:{c[:60]}" for p, c in LAUNCH])
def test_a_shown_launch_command_dry_runs(page, command, workdir):
    """As written, with --dry-run (before `--`), and with the local inputs it names in place."""
    argv = shlex.split(command)
    for flag, value in zip(argv, argv[1:]):  # the local folders it stages: a checkpoint and a QA folder
        if flag == "--policy":
            (workdir / value).mkdir(parents=True)
            (workdir / value / "config.json").write_text("{}")
        if flag == "--search-qa":
            (workdir / value / "qa").mkdir(parents=True)
    cut = argv.index("--") if "--" in argv else len(argv)
    done = subprocess.run([*argv[:cut], "--dry-run", *argv[cut:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
