"""Expert episodes: SFT flattening, mistakes with recovery, readable rendering."""

import numpy as np

from trace_jax.envs.hopworld import expert, protocol, reference, vocab


def test_flatten_masks_policy_tokens(world, cfg):
    ep = expert.expert_episode(world, cfg, 3, np.random.default_rng(0), mistake_prob=0.5)
    tokens, mask = expert.flatten(ep)
    assert tokens.shape == mask.shape and tokens.dtype == np.int32
    assert tokens[: len(ep.prompt)].tolist() == ep.prompt and not mask[: len(ep.prompt)].any()
    policy = tokens[mask == 1].tolist()
    assert policy == [t for turn in ep.turns for t in turn.action]
    observed = tokens[(mask == 0)][len(ep.prompt):].tolist()
    assert observed == [t for turn in ep.turns for t in turn.obs]
    assert protocol.INFO not in policy and protocol.THINK not in observed


def test_mistakes_happen_and_are_recovered(world, cfg):
    rng = np.random.default_rng(0)
    sloppy = corrected = 0
    for q in range(100):
        ep = expert.expert_episode(world, cfg, q, rng, mistake_prob=1.0)
        assert ep.reward == 1.0
        for turn in ep.turns:
            kind, content = reference.parse_action(turn.action)
            sloppy += kind == "search" and len(content) == 1
            corrected += "wrong" in vocab.decode(turn.action)
    assert sloppy > 0 and corrected > 0


def test_render_is_text(world, cfg):
    text = expert.render(expert.expert_episode(world, cfg, 0, np.random.default_rng(0)))
    assert text.startswith("<|im_start|> user what is the") and text.endswith("reward: 1.0")
    assert "<search>" in text and "<information>" in text and "<answer>" in text
