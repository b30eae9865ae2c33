"""The HopWorld tokenizer: a WordLevel `tokenizers` model over the fixed vocabulary.

Token ids equal `trace_jax.envs.hopworld.vocab.WORD_TO_ID`, so text only appears at the host
edge. Saved as `tokenizer.json` + `tokenizer_config.json` (with a Qwen-like chat template) and
loaded through `transformers.AutoTokenizer`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from trace_jax.envs.hopworld import vocab

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|> {{ message['role'] }} {{ message['content'] }} <|im_end|> "
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def build_tokenizer(out_dir: str | Path) -> PreTrainedTokenizerFast:
    """Build the tokenizer, save it under `out_dir` and return it."""
    tok = Tokenizer(models.WordLevel(vocab=dict(vocab.WORD_TO_ID), unk_token=vocab.UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in vocab.SPECIAL_TOKENS]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in vocab.TAG_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=vocab.PAD,
        unk_token=vocab.UNK,
        eos_token=vocab.EOS,
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    out = Path(out_dir)
    fast.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("chat_template") != CHAT_TEMPLATE:  # newer transformers write chat_template.jinja
        config["chat_template"] = CHAT_TEMPLATE
        config_path.write_text(json.dumps(config, indent=2))
    return fast


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer saved by `build_tokenizer` (offline, from the local directory)."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"no tokenizer.json under {path}; build it with "
            "`trace_jax.data.tokenizer.build_tokenizer(path)`"
        )
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tok.get_vocab() != vocab.WORD_TO_ID:
        raise ValueError(f"tokenizer at {path} does not match the HopWorld vocabulary; rebuild it")
    return tok
