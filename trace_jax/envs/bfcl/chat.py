"""The chat side of an episode: BFCL function docs as the OpenAI-style tools a Qwen3 chat template lists, the
message that reveals held-out functions, and the chat text that follows an assistant message.

`QWEN3_TOOL_TEMPLATE` is Qwen3's chat template without its thinking branches (a system message, `<tools>` in the
system prompt, assistant `<tool_call>` blocks, consecutive tool results in one user message of `<tool_response>`
blocks): for tokenizers trained here (tests, a tiny kit), whose template a real Qwen3 checkpoint brings itself.
"""

from __future__ import annotations

import json
from typing import Any

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
from transformers import PreTrainedTokenizerBase

from trace_jax.envs.bfcl.calls import Call, tool_call_text

QWEN3_TOOL_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- if loop.first and message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if call.function %}{%- set call = call.function %}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
END_OF_MESSAGE = "<|im_end|>"  # what closes a message in Qwen's chat format
DONE = "Done."  # an assistant message without calls: it closes a user turn


def assistant_messages(turns: list[list[list[Call]]]) -> list[str]:
    """The assistant messages making `turns` (user turn -> step -> its calls): a message per step that makes calls,
    then DONE closing the turn."""
    return [m for turn in turns for m in [tool_call_text(step) for step in turn if step] + [DONE]]
_MARK = "\x00assistant-message\x00"  # stands for an assistant message's text when rendering what follows it


def tools_of(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs -> OpenAI-style tools [{"type": "function", "function": {name, description, parameters}}],
    types mapped by bfcl's GORILLA_TO_OPENAPI (dict -> object, float -> number, ...)."""
    return [{"type": "function", "function": {"name": d["name"], "description": d["description"],
                                              "parameters": _openapi(d["parameters"])}} for d in docs]


def _openapi(schema: dict[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    if isinstance(out.get("type"), str):
        out["type"] = GORILLA_TO_OPENAPI.get(out["type"], "string")
    if isinstance(out.get("items"), dict):
        out["items"] = _openapi(out["items"])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {name: _openapi(s) for name, s in out["properties"].items()}
    return out


def reveal_message(docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The user message of a turn that adds held-out functions (bfcl sends only its text and re-renders the tools;
    a token-appending episode cannot change its system prompt, so the new tools come in the message, as Qwen3's
    system prompt lists them)."""
    tools = "\n".join(json.dumps(t) for t in tools_of(docs))
    return {"role": "user", "content": f"<tools>\n{tools}\n</tools>\n{DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}"}


def prompt_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]],
                docs: tuple[dict[str, Any], ...]) -> str:
    """An episode's prompt: its first user turn with the tools of `docs`, through the tokenizer's chat template."""
    return tokenizer.apply_chat_template(messages, tools=tools_of(docs), add_generation_prompt=True, tokenize=False)


def continuation_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    """The chat text after an assistant message's text when `messages` (tool results, a user turn) follow it: the
    end of that message, the messages, the next assistant's generation prompt."""
    text = tokenizer.apply_chat_template([{"role": "assistant", "content": _MARK}, *messages],
                                         add_generation_prompt=True, tokenize=False)
    return text[text.index(_MARK) + len(_MARK):]
