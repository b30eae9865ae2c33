"""launch/local.sh sets up what each job needs on a fresh machine: the package (and launch/no_deps.txt, bfcl-eval
without its pinned dependencies) for the main job, the test extra (PyTorch, pytest, mkdocs) only for the tests, and
again when pyproject.toml changes."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parent.parent

# Stands in for python3 and the .venv's interpreter: records what it was asked to run; `-m venv` makes the .venv.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$RECORD"
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
  printf '#!/usr/bin/env bash\\necho "trace-jax $*" >> "$RECORD"\\n' > "$3/bin/trace-jax" && chmod +x "$3/bin/trace-jax"
fi
"""


def test_the_main_job_installs_the_package_and_the_tests_add_their_extra(tmp_path):
    (tmp_path / "launch").mkdir()
    for name in ("local.sh", "no_deps.txt"):
        shutil.copy(ROOT / "launch" / name, tmp_path / "launch")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    record = tmp_path / "record"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record)}
    local = lambda *args: subprocess.run(["bash", "launch/local.sh", *args], cwd=tmp_path, env=env, check=True,
                                         capture_output=True, text=True)
    installs = lambda: [line for line in record.read_text().splitlines()
                        if "pip install -q" in line and "--upgrade" not in line]

    local("train", "steps=1")
    package, bfcl = "-m pip install -q -e .", "-m pip install -q --no-deps -r launch/no_deps.txt"
    assert installs() == [package, bfcl] and record.read_text().endswith("trace-jax train steps=1\n")
    local("train")  # set up already
    assert installs() == [package, bfcl]
    local("test", "-k", "x")
    assert installs() == [package, bfcl, "-m pip install -q -e .[test]", bfcl]
    assert record.read_text().endswith("-m pytest -k x\n")
    local("test")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'y'\n")  # changed: installed again
    local("train")
    assert installs()[4:] == [package, bfcl]
