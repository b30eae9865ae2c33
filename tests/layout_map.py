"""The architecture map (docs/architecture.md, "## Layout") as data: which entry (layer) names each module of the
package.

An entry is a line at the package's indent: a top-level module ("  config.py"), a module of a folder that the map
places on a layer of its own ("  rollout/tree.py"), or a folder ("  models/"), whose text (and that of its
sub-folders, "    hopworld/") names its modules ("qwen3.py: ..."), all but those given an entry of their own.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGE = "trace_jax"
_NAMED = re.compile(r"(?:^|[\s(`])([a-z_0-9]+\.py)(?=[\s:,)`]|$)")


def layout_text(page: Path = ROOT / "docs" / "architecture.md") -> str:
    text = page.read_text()
    return text[text.index("## Layout\n"):]


def map_lines(layout: str) -> list[str]:
    """The lines of the map's code block from `trace_jax/` to the last line of the package."""
    block = layout.split("```")[1].splitlines()
    start = block.index(f"{PACKAGE}/")
    lines = []
    for line in block[start + 1:]:
        if line and not line.startswith(" "):  # the next top-level folder of the repository
            break
        lines.append(line)
    return lines


def module_entries(layout: str) -> dict[str, int]:
    """{dotted module name: index of the map entry that names it}, in the map's order (0: the first entry)."""
    entries: list[tuple[str, str]] = []  # (folder, or "folder/module.py" for a module placed alone; text)
    for line in map_lines(layout):
        head = line.split()[0] if line.strip() else ""
        if line.startswith("  ") and not line.startswith("   "):  # an entry at the package's indent
            entries.append((head, line[2 + len(head):]))
        elif line.startswith("    ") and not line.startswith("     ") and head.endswith("/"):  # a sub-folder
            entries.append((entries[-1][0].split("/")[0] + "/" + head, line[4 + len(head):]))
        elif entries:
            entries[-1] = (entries[-1][0], entries[-1][1] + "\n" + line)
    own = {head[:-3].replace("/", "."): i for i, (head, _) in enumerate(entries) if head.endswith(".py")}
    out = {f"{PACKAGE}.{name}": i for name, i in own.items()}
    for i, (head, text) in enumerate(entries):
        if not head.endswith("/"):
            continue
        folder = head.rstrip("/").replace("/", ".")
        out.setdefault(f"{PACKAGE}.{folder}", i)  # the package itself: its first entry
        for name in _NAMED.findall(text):
            if f"{folder}.{name[:-3]}" not in own:
                out.setdefault(f"{PACKAGE}.{folder}.{name[:-3]}", i)
    return out
