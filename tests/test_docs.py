"""The README stays short and its links resolve; the documentation site over docs/ builds in strict mode (a broken
link or anchor, or a page the nav leaves out, fails)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def test_the_readme_is_at_most_300_lines_and_its_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "the README is for users: move details into docs/"
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and t[0] != "#"]
    assert targets and not [t for t in targets if not (ROOT / t).exists()]
    anchors = [t[1:] for t in re.findall(r"\]\((#[^)]+)\)", text)]
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}
    assert not [a for a in anchors if a not in headings]


def test_the_docs_site_builds_in_strict_mode(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    assert mkdocs, "mkdocs is not installed: the test extra installs it (pip install -e '.[test]')"
    result = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "engine" / "index.html").is_file()


def test_ci_runs_exactly_the_readmes_test_command():
    text = README.read_text()
    tests = text[text.index("\n## Tests\n"):]
    block = tests[tests.index("Test command"):].split("```bash\n", 1)[1].split("```", 1)[0].strip()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]  # its one command, past the shell preamble
    assert ci == [block]
