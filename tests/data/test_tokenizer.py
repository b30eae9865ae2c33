"""Tokenizer: ids equal the fixed vocabulary, every world string round-trips, chat template."""

import numpy as np
import pytest

from trace_jax.data.tokenizer import build_tokenizer, load_tokenizer
from trace_jax.envs.hopworld import expert, protocol, vocab
from trace_jax.envs.hopworld.config import HopWorldConfig
from trace_jax.envs.hopworld.world import build_world


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in path.iterdir()}
    return load_tokenizer(path)


def test_vocabulary_is_fixed(tokenizer):
    assert tokenizer.get_vocab() == vocab.WORD_TO_ID
    assert tokenizer.pad_token_id == protocol.PAD and tokenizer.eos_token_id == protocol.EOS


def test_every_world_string_round_trips(tokenizer):
    world = build_world(HopWorldConfig(seed=1, num_entities=128, num_questions=300))
    texts = [world.doc_text(e) for e in range(world.num_entities)]
    texts += [world.question_text(q) for q in range(world.num_questions)]
    texts += [world.answer_text(q) for q in range(world.num_questions)]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert ids == [vocab.encode(t) for t in texts]
    assert tokenizer.batch_decode(ids) == texts


def test_episode_with_tags_round_trips(tokenizer, small_world, small_cfg):
    rng = np.random.default_rng(0)
    ep = expert.expert_episode(small_world, small_cfg, 0, rng, mistake_prob=1.0)
    tokens, _ = expert.flatten(ep)
    text = tokenizer.decode(tokens.tolist())
    assert text == vocab.decode(tokens.tolist())
    assert tokenizer.encode(text, add_special_tokens=False) == tokens.tolist()


def test_chat_template_matches_protocol_prompt(tokenizer, small_world):
    question = small_world.question_text(4)
    messages = [{"role": "user", "content": question}]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="np")
    ids = out["input_ids"] if "input_ids" in out else out  # noqa: SIM401  (a BatchEncoding or an array)
    expected = protocol.prompt_ids(small_world.question_ids(4))
    np.testing.assert_array_equal(np.asarray(ids)[0], expected)


def test_missing_tokenizer_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="build_tokenizer"):
        load_tokenizer(tmp_path / "nowhere")
