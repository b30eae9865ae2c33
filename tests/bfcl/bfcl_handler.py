"""bfcl-eval's own decoding of a Qwen3 message in its multi-turn inference loop, run from its source: the methods of
`QwenFCHandler` that read a response (`_parse_query_response_prompting`, `decode_execute`, `_extract_tool_calls`)
and `convert_to_function_call`, compiled from bfcl-eval's installed files. Importing the handler's module would pull
its API clients and parsers (openai, tree_sitter, ...), which launch/no_deps.txt leaves out on purpose."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bfcl_eval
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response

ROOT = Path(bfcl_eval.__file__).parent


def _functions(path: Path, names: set[str], within: str | None = None) -> dict[str, Any]:
    """The named functions (of class `within`) of a bfcl-eval source file, compiled without their decorators but
    @staticmethod, in a namespace holding what they use."""
    tree = ast.parse(path.read_text())
    body = next(n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == within) if within else tree.body
    found = {}
    namespace = {"re": re, "json": json, "Any": Any, "convert_to_function_call": None}
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
            node.decorator_list = []
            exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
            found[node.name] = staticmethod(namespace[node.name]) if static else namespace[node.name]
    assert set(found) == names, f"{path} lacks {names - set(found)}: bfcl-eval changed; re-read its handler"
    return found | {"namespace": namespace}


_handler = _functions(ROOT / "model_handler/local_inference/qwen_fc.py",
                      {"_parse_query_response_prompting", "decode_execute", "_extract_tool_calls"}, "QwenFCHandler")
_utils = _functions(ROOT / "model_handler/utils.py", {"convert_to_function_call"})
_handler.pop("namespace")["convert_to_function_call"] = _utils["convert_to_function_call"]
QwenDecoding = type("QwenDecoding", (), _handler)


def bfcl_step(message: str) -> list[str] | None:
    """What bfcl's inference loop does with one assistant message: the call strings it executes, or None where it
    ends the user turn (decoding raised, or decoded no call)."""
    handler = QwenDecoding()
    reply = SimpleNamespace(choices=[SimpleNamespace(text=message)],
                            usage=SimpleNamespace(prompt_tokens=0, completion_tokens=0))
    responses = handler._parse_query_response_prompting(reply)["model_responses"]
    try:
        decoded = handler.decode_execute(responses, has_tool_call_tag=False)
    except Exception:
        return None
    return None if is_empty_execute_response(decoded) else decoded
