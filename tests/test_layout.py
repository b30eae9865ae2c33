"""The README's architecture map ("Layout") names every module and folder of the package, and the repository's
top-level folders: it cannot drift from the tree unnoticed."""

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent


def _layout() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Layout\n"):readme.index("## Not yet here")]


def test_the_layout_names_every_module_and_folder():
    layout = _layout()
    package = ROOT / "trace_jax"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if path.name == "__init__.py" or "__pycache__" in rel.parts:
            continue
        folders = [f"{part}/" for part in rel.parts[:-1]]
        # a top-level module as "  name.py", a module in a folder by its name, its folders as "name/"
        if folders:
            named = re.search(rf"(^|[\s(]){re.escape(path.name)}[\s:,)]", layout) is not None
        else:
            named = f"  {path.name} " in layout
        if not named or not all(f in layout for f in folders):
            missing.append(str(rel))
    assert not missing, f"README's Layout does not mention: {missing}"
    for folder in ("configs/", "docs/", "launch/", "colab/", "tests/"):
        assert folder in layout, folder
