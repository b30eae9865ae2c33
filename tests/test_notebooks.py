"""The Colab notebooks (launch/colab) run top to bottom offline, at the tiny sizes their TEST flag selects, and each
opens with a Colab badge for its own path in the project's repository."""

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


def _run(name: str, where: Path):
    """The notebook `name` executed in a fresh kernel in `where` with TRACE_JAX_NOTEBOOK_TEST=1 and one CPU device (as
    on Colab's CPU runtime); a failing cell raises, naming it. Returns (notebook with outputs, printed text, images)."""
    book = nbformat.read(COLAB / f"{name}.ipynb", as_version=4)
    env = {**os.environ, "TRACE_JAX_NOTEBOOK_TEST": "1", "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    client = NotebookClient(book, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(where)}})
    client.execute(env=env)
    outputs = [out for cell in book.cells if cell.cell_type == "code" for out in cell.outputs]
    images = sum("image/png" in out.get("data", {}) for out in outputs)
    return book, "".join(out.get("text", "") for out in outputs), images


# slow: the two take about 1.5 minutes of the suite's wall time on 2 cores, which pushed the default suite to 9.3-10.7
# minutes in fresh-clone runs; they stay there until the suite has room for them
@pytest.mark.slow
def test_quickstart_and_compare_run_top_to_bottom(tmp_path):
    """One test, so the second notebook finds the programs they share (SFT, warm-up, evaluation, the TRACE step) in
    the session's compilation cache."""
    _, printed, images = _run("quickstart", tmp_path)
    assert re.search(r"test success: [\d.]+% at step 0 -> [\d.]+% at step 2", printed)
    assert "trace M=4 N=1, step 2" in printed and images >= 3  # live plots, reliability, the tree
    _, printed, images = _run("compare", tmp_path)
    results = (tmp_path / "trace_jax_compare" / "compare" / "results.md").read_text()
    assert results.count("| trace |") == results.count("| grpo |") == 1 and images == 4


@pytest.mark.slow
def test_bring_your_checkpoint_runs_top_to_bottom(tmp_path):
    _, printed, _ = _run("bring_your_checkpoint", tmp_path)
    assert "retriever at http://127.0.0.1:" in printed and "<search>" in printed and "step 1: reward" in printed
    difference = float(re.search(r"JAX vs transformers: (\S+)", printed).group(1))
    assert difference < 1e-4
