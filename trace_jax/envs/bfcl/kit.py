"""The tiny offline BFCL kit, written in seconds: what the tests and a CPU demo run on.

`write_tiny_bfcl(out)` writes policy/: a tiny Qwen3 checkpoint and a byte-level BPE tokenizer with Qwen3's tool chat
template (`chat.QWEN3_TOOL_TEMPLATE`), trained on the kit's own conversations (`TINY.entry_ids`: a few short
TradingBot entries of the base subset, train and eval side of split seed 0). Its pre-tokenizer does not split on
spaces, so the function docs that every prompt repeats compress to a few tokens. The policy is fitted on the
training entries' ground truth: the prompt, then per model step the assistant message with its `<tool_call>` blocks
(a message without calls closes a user turn) and the observation the environment itself returns.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from trace_jax.data.search_qa_tiny import SPECIAL_TOKENS, fit_episodes, random_qwen3
from trace_jax.envs.bfcl.apis import Apis
from trace_jax.envs.bfcl.chat import DONE, END_OF_MESSAGE, QWEN3_TOOL_TEMPLATE, assistant_messages, tools_of
from trace_jax.envs.bfcl.config import BfclConfig
from trace_jax.envs.bfcl.data import Entry, load_entries
from trace_jax.envs.bfcl.env import BfclEnv
from trace_jax.envs.bfcl.episode import Episode, reference
from trace_jax.models.hf_io import save_pretrained

TRAIN_IDS = tuple(f"multi_turn_base_{n}" for n in (132, 100, 104, 120, 115))  # split seed 0's train side
EVAL_IDS = ("multi_turn_base_105", "multi_turn_base_123")  # its eval side
TINY = BfclConfig(subsets=("base",), entry_ids=TRAIN_IDS + EVAL_IDS, max_turns=8, action_len=16, obs_len=24,
                  prompt_len=40)  # configs/bfcl_tiny.yaml shapes


def ground_truth_messages(entry: Entry) -> list[str]:
    """The assistant messages of `entry`'s ground truth: per user turn one message with all its calls (none if the
    turn has none), then DONE."""
    binder = Apis.of(entry)
    return assistant_messages([[[binder.bind(c) for c in calls]] for calls in entry.ground_truth])


def conversation(entry: Entry) -> list[dict[str, str]]:
    """The ground truth's whole conversation as chat messages (tool results from the text-level episode)."""
    ref, episode, out = reference(entry), Episode.start(entry), [dict(m) for m in entry.turns[0]]
    for text in ground_truth_messages(entry):
        out += [{"role": "assistant", "content": text}, *episode.step(text, entry, ref).messages]
    return out


def train_tool_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE with Qwen's special tokens and the tool chat template, merging across spaces (no regex
    pre-split): repeated long texts (function docs, the template's system prompt) become few tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=END_OF_MESSAGE, pad_token="<|endoftext|>",
                                   chat_template=QWEN3_TOOL_TEMPLATE)


def scripted_episode(env: BfclEnv, question: int) -> tuple[list[int], list[bool]]:
    """(tokens, policy mask) of the question's ground truth, each observation from `env` itself (as a rollout has
    it); every assistant message ends with the end-of-message token."""
    tok, end = env.tokenizer, env.tokenizer.convert_tokens_to_ids(END_OF_MESSAGE)
    tokens = env.prompt_ids(question)
    mask, past = [False] * len(tokens), []
    for text in ground_truth_messages(env.entries[question]):
        action = tok.encode(text, add_special_tokens=False) + [end]
        act = np.zeros((1, len(action)), np.int32)
        act[0] = action
        obs, obs_len, _, done = env.step(np.array([question]), np.array([len(past)]), np.array([True]), act,
                                         np.array([len(action)]), past_actions=[past])
        seen = obs[0, : obs_len[0]].tolist()
        tokens, mask = tokens + action + seen, mask + [True] * len(action) + [False] * len(seen)
        past = [*past, np.asarray(action, np.int32)]
        if done[0]:
            break
    return tokens, mask


def write_tiny_bfcl(out_dir: str | Path, vocab_size: int = 3000, seed: int = 0, sft_steps: int = 200) -> Path:
    """Writes the kit under out_dir (see the module docstring); returns out_dir. sft_steps=0: a random policy."""
    out = Path(out_dir)
    by_id = {e.id: e for e in load_entries(TINY.subsets)}
    entries = [by_id[i] for i in TINY.entry_ids]
    render = train_tool_tokenizer([DONE], 300)  # renders the template only: its vocabulary is not used
    texts = [render.apply_chat_template(conversation(e), tools=tools_of(e.functions), tokenize=False)
             for e in entries]
    tokenizer = train_tool_tokenizer(texts, vocab_size)
    policy = out / "policy"
    tokenizer.save_pretrained(policy)
    model = random_qwen3(len(tokenizer), seed)
    if sft_steps:
        fine_tune(model, tokenizer, [by_id[i] for i in TRAIN_IDS], sft_steps, seed)
    save_pretrained(model, policy)
    return out


def fine_tune(model, tokenizer: PreTrainedTokenizerBase, entries: list[Entry], steps: int, seed: int) -> None:
    """Adam steps on the ground-truth episodes of `entries` (in place)."""
    env = BfclEnv(tokenizer, entries, TINY.max_turns, TINY.action_len, TINY.obs_len, cache_size=0)
    fit_episodes(model, [scripted_episode(env, q) for q in range(len(entries))], tokenizer.pad_token_id, steps, seed)
