"""bfcl-eval is installed without its dependencies (they pin numpy==1.26.4 and pull API clients): the packages its
multi-turn code imports are the project's own dependencies. Every bfcl_eval module the project uses must import."""

import importlib
import subprocess
import sys

import pytest

BFCL_MODULES = (
    "bfcl_eval.constants.category_mapping",
    "bfcl_eval.constants.default_prompts",
    "bfcl_eval.constants.executable_backend_config",
    "bfcl_eval.constants.type_mappings",
    "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
    "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils",
    *(f"bfcl_eval.eval_checker.multi_turn_eval.func_source_code.{m}" for m in (
        "gorilla_file_system", "math_api", "message_api", "posting_api", "ticket_api", "trading_bot",
        "travel_booking", "vehicle_control")),
)
THIRD_PARTY = {"bfcl_eval", "mpmath"}  # what those modules import beyond the standard library (pyproject: mpmath)


@pytest.mark.parametrize("module", BFCL_MODULES)
def test_bfcl_module_imports(module):
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "bfcl_eval":
            pytest.fail("bfcl-eval is not installed: `pip install --no-deps -r launch/no_deps.txt`")
        pytest.fail(f"{module} imports the package {exc.name!r}, which is not installed: bfcl-eval is installed "
                    f"without its dependencies, so add {exc.name!r} to pyproject.toml's dependencies")


def test_bfcl_imports_nothing_else():
    """The modules pull in only THIRD_PARTY beyond the standard library: a new bfcl-eval importing more fails here
    (on this machine, where the package may be installed) before a fresh machine fails to import it."""
    code = (f"import importlib, sys\nbefore = set(sys.modules)\n"
            f"for m in {BFCL_MODULES!r}: importlib.import_module(m)\n"
            "print(' '.join({n.split('.')[0] for n in set(sys.modules) - before} - set(sys.stdlib_module_names)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    extra = sorted(set(out) - THIRD_PARTY)
    assert not extra, f"bfcl_eval's multi-turn modules now import {extra}: add them to pyproject.toml's dependencies"


def test_project_modules_import():
    for name in ("data", "calls", "apis", "chat", "episode", "env"):
        importlib.import_module(f"trace_jax.envs.bfcl.{name}")


def test_a_missing_bfcl_eval_names_its_install_command(monkeypatch):
    """Without bfcl-eval, `env=bfcl` fails naming the command that installs it (pip's plain install of the project
    does not bring it)."""
    from trace_jax.envs.registry import get_family

    for name in [n for n in sys.modules if n.startswith(("bfcl_eval", "trace_jax.envs.bfcl"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # import bfcl_eval now raises ModuleNotFoundError
    with pytest.raises(ValueError, match=r"install it with: pip install --no-deps -r launch/no_deps\.txt"):
        get_family("bfcl")
