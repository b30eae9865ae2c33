"""Shared BFCL fixtures: the four subsets (read once) and a tiny byte-level BPE tokenizer with Qwen3's tool chat
template (`chat.QWEN3_TOOL_TEMPLATE`; the search QA kit's template has no tools)."""

import json

import pytest

from trace_jax.envs.bfcl.chat import QWEN3_TOOL_TEMPLATE, tools_of
from trace_jax.envs.bfcl.data import Entry, load_entries


@pytest.fixture(scope="session")
def entries() -> list[Entry]:
    return load_entries()


@pytest.fixture(scope="session")
def tokenizer(entries):
    from trace_jax.data.search_qa_tiny import train_tokenizer

    sample = entries[::40]
    texts = [m["content"] for e in sample for turn in e.turns for m in turn]
    texts += [json.dumps(t) for e in sample for t in tools_of(e.functions)]
    tok = train_tokenizer(texts + ['<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'], vocab_size=800)
    tok.chat_template = QWEN3_TOOL_TEMPLATE
    return tok


@pytest.fixture(scope="session")
def bfcl_kit(tmp_path_factory):
    """The tiny BFCL kit (`envs.bfcl.kit`), its policy fitted briefly (100 steps) on five short entries' ground
    truth; built once."""
    from built_once import built_once, session_tmp

    from toy import fast_fitting
    from trace_jax.envs.bfcl.kit import write_tiny_bfcl

    def write(path):
        with fast_fitting():
            write_tiny_bfcl(path, sft_steps=100)

    return built_once(session_tmp(tmp_path_factory), "bfcl_kit", write)
