"""Function calls as text: the policy's Qwen3 tool calls in, BFCL's call strings out, and back.

A Qwen3 assistant message holds zero or more `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks.
`decode_calls` reads them as bfcl's Qwen handler does (`bfcl_tool_calls`, the default: what a leaderboard scores)
or leniently (`parse_tool_calls`: every block, malformed ones answered with an error).
BFCL scores and stores calls as Python call strings, `func(a=1, b='x')` (its ground truth, its `--calls` result
files); those are read here with `ast` as literals only: nothing from a model or a file is ever evaluated.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import re
from typing import Any, NamedTuple

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
# bfcl-eval's QwenFCHandler._extract_tool_calls pattern (model_handler/local_inference/qwen_fc.py), newlines included
QWEN_TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
DECODINGS = ("bfcl", "lenient")
MAX_CALL_CHARS = 32768  # a call's JSON at most (the ground truth's longest is 6.8k): bounds what a call may cost


class Call(NamedTuple):
    name: str
    arguments: dict[str, Any]


def parse_tool_calls(text: str) -> list[Call | str]:
    """The `<tool_call>` blocks of an assistant message, in order: a Call, or for a block that is not one, the
    reason as an error string. [] when the message holds no block (it answers the user)."""
    out: list[Call | str] = []
    for match in TOOL_CALL.finditer(text):
        out.append(_tool_call(match.group(1), closed=match.group(0).endswith("</tool_call>")))
    return out


def bfcl_tool_calls(text: str) -> list[Call]:
    """The calls bfcl's Qwen handler executes from an assistant message; [] where it ends the user turn instead.

    As `QwenFCHandler` does: only the text after the last `</think>` is read; its blocks are those of bfcl's
    pattern (newlines after `<tool_call>` and before `</tool_call>`); a block that is not JSON is dropped; a message
    with no block left, or one whose blocks are not all objects with a "name" and an "arguments" object (or JSON
    string of one), makes no call (bfcl's `decode_execute` raises or returns nothing, and the turn ends)."""
    if "</think>" in text:
        text = text.split("</think>")[-1].lstrip("\n")
    items = []
    for body in QWEN_TOOL_CALL.findall(text):
        with contextlib.suppress(ValueError, RecursionError):  # bfcl drops a block that is not JSON
            items.append(json.loads(body))
    calls = []
    for item in items:
        try:
            name, arguments = item["name"], item["arguments"]
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            hash(name)  # bfcl makes the name a dict key: a list or object fails there
            calls.append(Call(str(name), dict(arguments.items())))  # and writes f"{name}(...)": 5 names no function
        except (TypeError, KeyError, AttributeError, ValueError, RecursionError):
            return []
    return calls


def decode_calls(text: str, decoding: str = "bfcl") -> list[Call | str]:
    """An assistant message's calls under `decoding` ("bfcl": `bfcl_tool_calls`; "lenient": `parse_tool_calls`,
    whose error strings are answered as results). [] ends the user turn."""
    if decoding == "bfcl":
        return bfcl_tool_calls(text)
    if decoding == "lenient":
        return parse_tool_calls(text)
    raise ValueError(f"decoding {decoding!r} is not one of {DECODINGS}")


def _tool_call(body: str, closed: bool) -> Call | str:
    if not closed:
        return "the <tool_call> block is not closed by </tool_call>"
    if len(body) > MAX_CALL_CHARS:
        return f"the tool call is {len(body)} characters long, over the limit of {MAX_CALL_CHARS}"
    try:
        call = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        return f'the tool call is not valid JSON ({exc}); write {{"name": <function-name>, "arguments": {{...}}}}'
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'the tool call must be a JSON object {"name": <function-name>, "arguments": {...}}'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments, parse_constant=_no_constant, parse_float=_finite)
        except (ValueError, RecursionError):
            return "the tool call's arguments are a string that is not a JSON object"
    if not isinstance(arguments, dict):
        return f"the tool call's arguments must be a JSON object, not {type(arguments).__name__}"
    return Call(call["name"], arguments)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


def tool_call_text(calls: list[Call]) -> str:
    """An assistant message making `calls`, in Qwen3's format (the inverse of `parse_tool_calls`)."""
    return "\n".join(f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>"
                     for c in calls)


def call_string(call: Call) -> str:
    """BFCL's call string of a call: `name(a=1, b='x')` (each value's Python literal)."""
    return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


def parse_call_string(text: str) -> tuple[str, list[Any], dict[str, Any]]:
    """(name, positional values, keyword values) of a call string `name(1, b='x')`; values must be literals.
    Raises ValueError naming what is not."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not a call: {exc}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError("not a call of a plain function name, name(arg=value, ...)")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise ValueError("*args and **kwargs are not allowed in a call string")
    try:
        return (node.func.id, [ast.literal_eval(a) for a in node.args],
                {k.arg: ast.literal_eval(k.value) for k in node.keywords})
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
        raise ValueError(f"an argument is not a literal value: {exc}") from None
