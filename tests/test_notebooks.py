"""The Colab notebooks (launch/colab) run top to bottom offline, at the tiny sizes their TEST flag selects, and each
opens with a Colab badge for its own path in the project's repository."""

import fnmatch
import os
import re
import tomllib
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).parent.parent
COLAB = ROOT / "launch" / "colab"
NOTEBOOKS = sorted(p.stem for p in COLAB.glob("*.ipynb"))


def test_each_notebook_links_and_installs_from_the_repository():
    assert NOTEBOOKS == ["bring_your_checkpoint", "compare", "quickstart"]
    repo = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    for name in NOTEBOOKS:
        book = nbformat.read(COLAB / f"{name}.ipynb", as_version=4)
        link = f"colab.research.google.com/github/{repo.removeprefix('https://github.com/')}/blob/main/launch/colab"
        assert f"{link}/{name}.ipynb" in book.cells[0].source, name  # the badge opens this notebook
        assert f'REPO = "{repo}"' in book.cells[1].source and "%pip install" in book.cells[1].source, name
        assert not any(cell.get("outputs") for cell in book.cells if cell.cell_type == "code"), f"{name}: outputs"
        assert book.cells[1].source == _install_cell(), f"{name}: its install cell differs from quickstart's"


def _install_cell() -> str:
    return nbformat.read(COLAB / "quickstart.ipynb", as_version=4).cells[1].source


def _run_install_cell(monkeypatch, devices: list[str], env: dict[str, str], upgrade: dict[str, str]) -> list[str]:
    """The install cell as IPython runs it, on a runtime without trace-jax whose /dev holds `devices` and whose
    environment has `env`; its %pip records its command and `upgrade`s the versions importlib.metadata reports.
    Returns the %pip command line."""
    import glob
    import importlib.metadata
    import importlib.util

    from IPython.core.inputtransformer2 import TransformerManager
    from IPython.utils.text import DollarFormatter

    versions = {"numpy": "1.0", "jax": "0.1", "jaxlib": "0.1"}
    commands, namespace = [], {}

    class Shell:
        def run_line_magic(self, magic: str, line: str) -> None:  # with {expressions} expanded, as IPython does
            commands.append(f"%{magic} " + DollarFormatter().vformat(line, args=[], kwargs=namespace))
            versions.update(upgrade)

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trace_jax" else object())
    monkeypatch.setattr(glob, "glob", lambda pattern: [d for d in devices if fnmatch.fnmatch(d, pattern)])
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions[name])
    for key in ("TPU_ACCELERATOR_TYPE", "COLAB_TPU_ADDR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = TransformerManager().transform_cell(_install_cell())
    namespace["get_ipython"] = Shell
    exec(compile(code, "<install cell>", "exec"), namespace)
    (command,) = commands
    return command


@pytest.mark.parametrize("devices, env, tpu", [
    ([], {}, False),  # a CPU runtime
    (["/dev/accel0", "/dev/accel1"], {}, True),  # TPU v2-v4 VMs
    (["/dev/vfio/0", "/dev/vfio/vfio"], {}, True),  # v5e and later: vfio devices
    (["/dev/vfio/vfio"], {}, False),  # the vfio control node alone is no TPU
    ([], {"TPU_ACCELERATOR_TYPE": "v5litepod-1"}, True),
])
def test_the_install_cell_adds_jax_tpu_only_on_a_tpu_runtime(monkeypatch, capsys, devices, env, tpu):
    command = _run_install_cell(monkeypatch, devices, env, upgrade={})
    assert command.startswith('%pip install -q "trace-jax @ git+https://github.com/trace-jax/trace-jax"')
    assert command.endswith("jax[tpu]") == tpu
    assert "restart" not in capsys.readouterr().out


def test_the_install_cell_asks_for_a_restart_when_it_upgrades_a_loaded_module(monkeypatch, capsys):
    _run_install_cell(monkeypatch, [], {}, upgrade={"numpy": "2.0", "jaxlib": "0.2"})
    assert "upgraded numpy, jaxlib, which this session had loaded: restart the session" in capsys.readouterr().out


# First in the kernel: runs get one device's mesh, as on Colab's CPU runtime, in a kernel with the session's 8 host
# devices, whose programs' cache keys the tests' processes share (`one_device`)
ONE_DEVICE_MESH = f"""import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import one_device
from trace_jax import sharding
sharding.make_mesh = one_device.make_mesh"""


def _run(names: list[str], where: Path, parameters: dict[str, str] | None = None):
    """The notebooks `names` executed one after the other in one fresh kernel in `where`, with
    TRACE_JAX_NOTEBOOK_TEST=1 and `parameters` set in a cell after the first one's `parameters`-tagged cell (as
    papermill does); a failing cell raises, naming it. Between notebooks `%reset -f` empties the namespace, so each
    notebook still runs on what it defines itself, while the kernel keeps its imports and compiled programs. The
    kernel has the session's XLA flags and compilation cache, and runs on one device's mesh (`ONE_DEVICE_MESH`), so
    it reuses what the tests compiled with the same shapes. Returns (printed text, images), one pair per notebook."""
    books = [nbformat.read(COLAB / f"{name}.ipynb", as_version=4) for name in names]
    if parameters:
        at = next(i for i, cell in enumerate(books[0].cells) if "parameters" in cell.metadata.get("tags", []))
        assign = "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
        books[0].cells.insert(at + 1, nbformat.v4.new_code_cell(assign))
    joined = nbformat.v4.new_notebook(metadata=books[0].metadata)  # cells assigned below stay the books' own
    joined.cells.append(nbformat.v4.new_code_cell(ONE_DEVICE_MESH))
    for i, book in enumerate(books):
        joined.cells += [nbformat.v4.new_code_cell("%reset -f")] * (i > 0) + book.cells
    client = NotebookClient(joined, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(where)}})
    client.execute(env={**os.environ, "TRACE_JAX_NOTEBOOK_TEST": "1"})
    outputs = [[out for cell in book.cells if cell.cell_type == "code" for out in cell.outputs] for book in books]
    return [("".join(out.get("text", "") for out in outs), sum("image/png" in out.get("data", {}) for out in outs))
            for outs in outputs]


def test_quickstart_and_compare_run_top_to_bottom(tmp_path):
    """One kernel, so the second notebook finds the modules and programs they share (SFT, warm-up, evaluation, the
    TRACE step) already loaded."""
    (printed, images), (printed_compare, images_compare) = _run(["quickstart", "compare"], tmp_path)
    assert re.search(r"test success: [\d.]+% at step 0 -> [\d.]+% at step 2", printed)
    assert "trace M=4 N=1, step 2" in printed and images >= 3  # live plots, reliability, the tree
    assert "compare: results in" in printed_compare and images_compare == 4
    results = (tmp_path / "trace_jax_compare" / "compare" / "results.md").read_text()
    assert results.count("| trace |") == results.count("| grpo |") == 1


def test_bring_your_checkpoint_runs_top_to_bottom(kit, tmp_path):
    """With the session's tiny kit as the user's own checkpoint, QA files and corpus: the search QA training test
    compiles the same programs (same config and shapes, on one device's mesh)."""
    files = {"HF_DIR": kit / "policy", "QA_DIR": kit / "qa", "CORPUS": kit / "corpus.jsonl"}
    [(printed, _)] = _run(["bring_your_checkpoint"], tmp_path, {k: str(v) for k, v in files.items()})
    assert "retriever at http://127.0.0.1:" in printed and "<search>" in printed and "step 1: reward" in printed
    difference = float(re.search(r"JAX vs transformers: (\S+)", printed).group(1))
    assert difference < 1e-4


@pytest.mark.slow
def test_the_install_cell_installs_a_working_package_into_a_fresh_environment(tmp_path):
    """The install cell, run by IPython in a fresh virtual environment with the package's wheel in place of the
    repository: every module of the package then imports, and the CLI runs (the wheel's declared dependencies are
    complete; the BFCL modules, whose bfcl-eval is installed without its dependencies by launch/local.sh, aside).
    Minutes: everything is installed from the package index."""
    import shutil
    import subprocess
    import sys

    run = lambda *cmd, **kw: subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800, **kw)
    source = tmp_path / "source"  # the working tree's files (a build writes build/ beside its sources)
    for name in run("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT).stdout.splitlines():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(source))
    (wheel,) = (tmp_path / "dist").glob("trace_jax-*.whl")
    env = tmp_path / "fresh"
    run(sys.executable, "-m", "venv", str(env))
    run(str(env / "bin" / "pip"), "install", "-q", "ipython")
    cell = _install_cell().replace('f"trace-jax @ git+{REPO}"', repr(str(wheel)))
    assert str(wheel) in cell
    run(str(env / "bin" / "ipython"), "-c", cell, cwd=tmp_path)
    bfcl = ROOT / "trace_jax" / "envs" / "bfcl"  # needs bfcl-eval installed without its dependencies (local.sh)
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "trace_jax").rglob("*.py")
                     if bfcl not in p.parents)
    run(str(env / "bin" / "python"), "-c", f"import importlib; [importlib.import_module(m) for m in {modules!r}]",
        cwd=tmp_path)
    assert "usage: trace-jax" in run(str(env / "bin" / "trace-jax"), "--help", cwd=tmp_path).stdout
