"""The configuration reference (`docs/config.md`), generated from the config dataclasses so it cannot drift:
every key of every command's config, with its default and the comment written beside its field."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Iterator
from typing import Any

from trace_jax.compare.config import CompareConfig
from trace_jax.config import SFTConfig, TrainConfig
from trace_jax.envs.bfcl.config import BfclConfig
from trace_jax.envs.math.config import MathConfig

COMMANDS = (("trace-jax train", TrainConfig, ""), ("trace-jax sft", SFTConfig, ""),
            ("trace-jax compare", CompareConfig, ""), ("trace-jax train env=math", MathConfig, "task."),
            ("trace-jax train env=bfcl", BfclConfig, "task."))
_FIELD = re.compile(r"^\s+(\w+): [^=#]+(=.*?)?(?:  # (.*))?$")
_COMMENT = re.compile(r"^\s+# (.*)$")


def field_comments(cls: type) -> dict[str, str]:
    """{field: the `# comment` beside it, with the comment lines under it that continue it, or the comment lines
    above it}. Comment lines between two fields continue the first one's comment when the second has its own."""
    out: dict[str, str] = {}
    block: list[str] = []  # comment lines since the last field
    last = None  # the last field with a comment beside it, while only comment lines follow it
    for line in inspect.getsource(cls).splitlines():
        field, comment = _FIELD.match(line), _COMMENT.match(line)
        if comment:
            block.append(comment.group(1))
            continue
        if field and field.group(3):
            if last and block:
                out[last] += " " + " ".join(block)
            out[field.group(1)], last = field.group(3), field.group(1)
        elif field and block:
            out[field.group(1)], last = " ".join(block), None
        else:
            last = None
        block = []
    if last and block:
        out[last] += " " + " ".join(block)
    return out


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def _doc(cls: type) -> str:
    """The first paragraph of the class docstring ("" for the dataclass's generated one)."""
    doc = inspect.getdoc(cls) or ""
    return "" if doc.startswith(f"{cls.__name__}(") else " ".join(doc.split("\n\n")[0].split())


def _sections(cfg: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted prefix, dataclass instance) for cfg and every nested config, depth first."""
    yield prefix, cfg
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _sections(value, f"{prefix}{f.name}.")


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return "null" if value is None else str(value)


def reference() -> str:
    lines = ["# Configuration reference", "",
             "Generated from the config dataclasses by `trace-jax config-reference`; a test fails when it is stale.",
             "Keys are set in a YAML file (`--config`) or as `key=value` overrides (`world.seed=1`); nested sections",
             "are dotted. Defaults are what a command runs with no config.", ""]
    for command, cls, root in COMMANDS:  # root: the section's keys' prefix (a family's settings are `task.*`)
        lines += [f"## {command}", ""]
        for prefix, cfg in _sections(cls(), root):
            comments = field_comments(type(cfg))
            lines += [f"### `{prefix.rstrip('.') or command.split()[-1]}` ({type(cfg).__name__})", ""]
            lines += [_doc(type(cfg)), ""] if _doc(type(cfg)) else []
            lines += ["| key | default | meaning |", "|---|---|---|"]
            for f in dataclasses.fields(cfg):
                value = getattr(cfg, f.name)
                shown = "(section below)" if dataclasses.is_dataclass(value) else f"`{_cell(_show(value))}`"
                lines.append(f"| `{prefix}{f.name}` | {shown} | {_cell(comments.get(f.name, ''))} |")
            lines.append("")
    return "\n".join(lines)
