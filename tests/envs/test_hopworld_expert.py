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


def test_blind_spot_habit(world, cfg):
    """With the habit always on, every search for a person is their first name piece alone, and the expert follows
    the document it got back: it wins exactly when its chain of trusted documents ends at the answer."""
    from trace_jax.envs.hopworld.world import PERSON
    rng = np.random.default_rng(0)
    names = {tuple(world.name_ids(e)): e for e in range(world.num_entities)}
    wins = losses = 0
    for q in range(world.num_questions):
        ep = expert.expert_episode(world, cfg, q, rng, blind_type=PERSON, blind_prob=1.0)
        searches = [c for k, c in map(reference.parse_action, (t.action for t in ep.turns)) if k == "search"]
        entity, path = int(world.question_starts[q]), world.question_paths[q, : world.hops[q]].tolist()
        assert len(searches) == len(path)
        believed = entity
        for query, relation in zip(searches, path):
            full = world.name_ids(believed)
            assert query == (full[:1] if world.entity_types[believed] == PERSON else full)
            shown = reference.retrieve(world, query)
            target = int(world.relations[shown, relation])
            believed = target if target >= 0 else -1
            if believed < 0:
                break
        answered = names[tuple(reference.parse_action(ep.turns[-1].action)[1])]
        if believed >= 0:
            assert answered == believed
        assert ep.reward == (answered == int(world.answers[q]))
        wins, losses = wins + ep.reward, losses + (1 - ep.reward)
    assert wins > 0 and losses > 0


def test_blind_spot_off_is_the_plain_expert(world, cfg):
    """blind_prob 0, or a type the world's chains avoid, gives the plain expert's episodes draw for draw."""
    for q in range(40):
        plain = expert.expert_episode(world, cfg, q, np.random.default_rng(q), mistake_prob=0.5)
        off = expert.expert_episode(world, cfg, q, np.random.default_rng(q), mistake_prob=0.5, blind_type=0,
                                    blind_prob=0.0)
        assert off == plain
