"""Calls as text and as executions: Qwen3 tool calls decode as bfcl's Qwen handler decodes them (or leniently), BFCL
call strings parse (literals only), and running a call on an episode's instances gives exactly bfcl-eval's execution
result."""

import os

import mpmath
import pytest
from bfcl_handler import bfcl_step
from bfcl_replay import bfcl_results

from trace_jax.envs.bfcl.apis import LIMITS, MAX_DEPTH, MAX_INT, Apis, argument_error
from trace_jax.envs.bfcl.calls import (
    Call,
    bfcl_tool_calls,
    call_string,
    decode_calls,
    parse_call_string,
    parse_tool_calls,
    tool_call_text,
)
from trace_jax.envs.bfcl.config import BfclConfig

LS = '{"name": "ls", "arguments": {"a": true}}'
CD = '{"name": "cd", "arguments": {"folder": "docs"}}'
MESSAGES = [  # assistant messages, each read by bfcl's own handler code and by `bfcl_tool_calls`
    f"<tool_call>\n{LS}\n</tool_call>",
    f"<tool_call>\n{LS}\n</tool_call>\n<tool_call>\n{CD}\n</tool_call>",
    f"<tool_call>{LS}</tool_call>",  # without bfcl's newlines: no call
    f"<tool_call>\n{LS}</tool_call>",
    f"<think>\n<tool_call>\n{LS}\n</tool_call>\n</think>\n\nDone.",  # a call inside the thinking: not made
    f"<think>\nls first\n</think>\n\n<tool_call>\n{LS}\n</tool_call>",  # after it: made
    f"<think>a</think><tool_call>\n{CD}\n</tool_call><think>b</think>\n<tool_call>\n{LS}\n</tool_call>",
    f"<think>\n<tool_call>\n{LS}\n</tool_call>",  # thinking never closed: bfcl reads the whole message
    "<tool_call>\n{nope}\n</tool_call>",  # the only block malformed: no call, the turn ends
    f"<tool_call>\n{{nope}}\n</tool_call>\n<tool_call>\n{LS}\n</tool_call>",  # a malformed block is dropped
    f"<tool_call>\n[1, 2]\n</tool_call>\n<tool_call>\n{LS}\n</tool_call>",  # a block not an object: none made
    '<tool_call>\n{"name": "ls"}\n</tool_call>',  # no arguments
    '<tool_call>\n{"name": "cd", "arguments": "{\\"folder\\": \\"docs\\"}"}\n</tool_call>',  # as a JSON string
    '<tool_call>\n{"name": "cd", "arguments": "folder=docs"}\n</tool_call>',
    '<tool_call>\n{"name": "cd", "arguments": "[1]"}\n</tool_call>',
    '<tool_call>\n{"name": "ls", "arguments": null}\n</tool_call>',
    '<tool_call>\n{"name": "ls", "arguments": [true]}\n</tool_call>',
    '<tool_call>\n{"name": ["ls"], "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>',  # a number names a function (that none has)
    '<tool_call>\n{"name": null, "arguments": {"a b": 1}}\n</tool_call>',
    '<tool_call>\n{"name": "ls", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}\n</tool_call>",
    f"<tool_call>\n{LS}\n</tool_call>\n<tool_call>\n{CD}",  # the last block not closed
    "The files are a.txt and b.txt.",
    "",
]


@pytest.mark.parametrize("message", MESSAGES)
def test_calls_decode_as_bfcls_qwen_handler_decodes_them(message):
    """bfcl executes exactly these calls, or ends the turn where `bfcl_tool_calls` gives none (written as bfcl's
    `convert_to_function_call` writes a call string)."""
    ours = [f"{c.name}({','.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in bfcl_tool_calls(message)]
    assert (ours or None) == bfcl_step(message)
    assert decode_calls(message) == bfcl_tool_calls(message)


def test_lenient_decoding_reads_every_block_and_names_what_is_wrong():
    message = (f"<think>\n<tool_call>\n{LS}\n</tool_call>\n</think><tool_call>{CD}</tool_call>"
               "<tool_call>\n[1]\n</tool_call>")
    assert decode_calls(message, "bfcl") == []
    assert decode_calls(message, "lenient") == [Call("ls", {"a": True}), Call("cd", {"folder": "docs"}),
                                                 'the tool call must be a JSON object {"name": <function-name>, '
                                                 '"arguments": {...}}']
    with pytest.raises(ValueError, match="decoding 'loose' is not one of"):
        decode_calls(message, "loose")
    with pytest.raises(ValueError, match="task.decoding='loose' is not one of"):
        BfclConfig(decoding="loose")


def test_parse_tool_calls():
    text = ('<think>\nls, then cd\n</think>\n\n<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call>'
            '\n<tool_call>{"name": "cd", "arguments": "{\\"folder\\": \\"docs\\"}"}</tool_call> trailing text')
    assert parse_tool_calls(text) == [Call("ls", {"a": True}), Call("cd", {"folder": "docs"})]
    assert parse_tool_calls("The files are a.txt and b.txt.") == []
    calls = [Call("mkdir", {"dir_name": "x"}), Call("echo", {"content": "quote ' and \" and \n", "file_name": "y"})]
    assert parse_tool_calls(tool_call_text(calls)) == calls


@pytest.mark.parametrize("body, reason", [
    ('{"name": "ls", "arguments": {', "not valid JSON"),
    ('["ls", {}]', "must be a JSON object"),
    ('{"name": 5, "arguments": {}}', "must be a JSON object"),
    ('{"name": "ls", "arguments": [true]}', "arguments must be a JSON object"),
    ('{"name": "ls", "arguments": "not json"}', "not a JSON object"),
    ('{"name": "ls", "arguments": {"a": NaN}}', "not valid JSON"),
    ('{"name": "ls", "arguments": {"a": 1e999}}', "not valid JSON"),
    ('{"name": "ls", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}", "characters long"),
    ('{"name": "ls", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}", "not valid JSON"),
])
def test_malformed_tool_call_is_a_reason(body, reason):
    (result,) = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>")
    assert isinstance(result, str) and reason in result


def test_unclosed_tool_call():
    assert parse_tool_calls('<tool_call>\n{"name": "ls", "arguments": {}}') == [
        "the <tool_call> block is not closed by </tool_call>"]


def test_call_strings_round_trip(entries):
    """Every ground-truth call string binds (positional values named by the signature) and its canonical string
    parses back to the same call."""
    for entry in entries[:200]:
        apis = Apis.of(entry)
        for text in (c for turn in entry.ground_truth for c in turn):
            call = apis.bind(text)
            name, args, kwargs = parse_call_string(call_string(call))
            assert (name, args, kwargs) == (call.name, [], call.arguments)


@pytest.mark.parametrize("text", [
    "ls(a=__import__('os').system('touch /tmp/trace_jax_pwned'))",
    "__import__('os').system('touch /tmp/trace_jax_pwned')",
    "ls(a=True); import os",
    "(lambda: 1)()",
    "ls(*[True])",
    "ls(**{'a': True})",
    "os.system('ls')",
    "ls(a=[x for x in range(10)])",
    "ls(a=" + "(" * 100_000 + ")" * 100_000 + ")",
])
def test_call_string_with_code_is_refused(text, entries):
    with pytest.raises(ValueError):
        parse_call_string(text)
    entry = next(e for e in entries if "GorillaFileSystem" in e.involved_classes)
    result = Apis.of(entry).run_string(text, {d["name"]: d for d in entry.functions})
    assert result.startswith("Error during execution: ")
    assert not os.path.exists("/tmp/trace_jax_pwned")


def test_results_are_bfcls(entries):
    """Every ground-truth call of every entry (4.6k), run turn after turn on the episode's own instances, gives the
    very string bfcl-eval's execute_multi_turn_func_call gives (including mpmath and Decimal results)."""
    for entry in entries:
        apis = Apis.of(entry)
        docs = {d["name"]: d for d in entry.functions_at(len(entry.turns))}
        ours = [[apis.run_string(c, docs) for c in turn] for turn in entry.ground_truth]
        assert ours == bfcl_results(entry), entry.id


def test_process_wide_precision_restored(entries):
    """MathAPI's logarithm sets mpmath's precision for the whole process: it is restored after the call."""
    entry = next(e for e in entries if "MathAPI" in e.involved_classes)
    apis, dps = Apis.of(entry), mpmath.mp.dps
    docs = {d["name"]: d for d in entry.functions}
    result = apis.run(Call("logarithm", {"value": 2, "base": 10, "precision": 40}), docs)
    assert result.startswith("{'result': mpf('0.30102999566398119521373889472449302676")  # 40 digits, not 15
    assert mpmath.mp.dps == dps


@pytest.mark.parametrize("arguments, problem", [
    ({"value": 2, "base": 10, "precision": 5, "extra": 1}, "has no argument extra"),
    ({"value": 2, "base": 10}, "needs the argument precision"),
    ({"value": [2], "base": 10, "precision": 5}, "expected float, got array"),
    ({"value": {"a": 2}, "base": 10, "precision": 5}, "expected float, got object"),
    ({"value": None, "base": 10, "precision": 5}, "expected float, got null"),
    ({"value": 2, "base": 10, "precision": LIMITS["logarithm", "precision"] + 1}, "at most"),
    ({"value": 2, "base": 10, "precision": "5"}, "expected a number"),
    ({"value": MAX_INT, "base": 10, "precision": 5}, "does not fit in 64 bits"),
])
def test_argument_errors(entries, arguments, problem):
    entry = next(e for e in entries if "MathAPI" in e.involved_classes)
    doc = next(d for d in entry.functions if d["name"] == "logarithm")
    assert problem in argument_error(Call("logarithm", arguments), doc)


def test_nesting_and_optional_none(entries):
    entry = next(e for e in entries if "MathAPI" in e.involved_classes)
    doc = next(d for d in entry.functions if d["name"] == "mean")
    nested: list = [1.0]
    for _ in range(MAX_DEPTH + 1):
        nested = [nested]
    assert "expected float, got array" in argument_error(Call("mean", {"numbers": nested}), doc)
    ls = next(d for e in entries for d in e.functions if d["name"] == "ls")
    assert argument_error(Call("ls", {"a": None}), ls) is None  # an optional argument left at None
    assert argument_error(Call("ls", {"a": True}), ls) is None


def _mutable_ids(root) -> set[int]:
    """Ids of every dict, list, set and object reachable from root."""
    seen, todo = set(), [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, str | int | float | bool | type(None)):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            todo += obj.values()
        elif isinstance(obj, list | set | tuple):
            todo += obj
        elif hasattr(obj, "__dict__"):
            todo += vars(obj).values()
    return seen


def test_episodes_share_no_state(entries):
    """Two episodes of one entry (one entry per subset and class) share no mutable object, so a call in one never
    shows in the other: long-context scenarios load dicts of the package's own module into the state."""
    cases = {(e.subset, c): e for e in reversed(entries) for c in e.involved_classes}
    for entry in set(cases.values()):
        one, two = Apis.of(entry), Apis.of(entry)
        assert not _mutable_ids(one.instances) & _mutable_ids(two.instances), entry.id
