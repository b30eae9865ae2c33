"""The JAX env against the reference env: identical on random, adversarial and expert streams;
the expert solves every question, random play almost never does."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trace_jax.envs.hopworld import expert, jax_env, protocol, reference, vocab

P = protocol
TAGS = [P.THINK, P.THINK_END, P.SEARCH, P.SEARCH_END, P.ANSWER, P.ANSWER_END, P.INFO,
        P.INFO_END, P.PAD, P.EOS, P.IM_END, P.IM_START, P.UNK]
CONTENT = [i for i in range(vocab.VOCAB_SIZE) if i not in P.PROTOCOL_IDS]


def pad(action: list[int], size: int) -> tuple[np.ndarray, np.int32]:
    out = np.full(size, P.PAD, np.int32)
    action = action[:size]
    out[: len(action)] = action
    return out, np.int32(len(action))


def enc(text: str) -> list[int]:
    return vocab.encode(text)


any_token = st.one_of(
    st.sampled_from(TAGS), st.sampled_from(CONTENT), st.integers(-3, vocab.VOCAB_SIZE + 3)
)


@st.composite
def well_formed(draw, world) -> list[int]:
    think = draw(st.lists(st.sampled_from(CONTENT), max_size=5))
    entity = draw(st.integers(0, world.num_entities - 1))
    content = draw(st.sampled_from([
        world.name_ids(entity), world.name_ids(entity)[:1], world.name_ids(entity)[-1:],
        draw(st.lists(st.sampled_from(CONTENT), min_size=1, max_size=6)), [],
    ]))
    opener, closer = draw(st.sampled_from([(P.SEARCH, P.SEARCH_END), (P.ANSWER, P.ANSWER_END)]))
    tail = draw(st.lists(st.sampled_from([P.EOS, P.IM_END]), max_size=2))
    return [P.THINK, *think, P.THINK_END, opener, *content, closer, *tail]


@st.composite
def mutated(draw, base) -> list[int]:
    action = list(draw(base))
    how = draw(st.sampled_from(["none", "drop", "insert", "swap", "truncate", "append", "double"]))
    i = draw(st.integers(0, max(len(action) - 1, 0)))
    if how == "drop" and action:
        del action[i]
    elif how == "insert":
        action.insert(i, draw(any_token))
    elif how == "swap" and len(action) > 1:
        j = min(i + 1, len(action) - 1)
        action[i], action[j] = action[j], action[i]
    elif how == "truncate":
        action = action[:i]
    elif how == "append":
        action += draw(st.lists(any_token, max_size=30))
    elif how == "double":
        action += draw(base)
    return action


def actions_for(world):
    return st.one_of(
        st.lists(any_token, max_size=40),
        well_formed(world),
        mutated(well_formed(world)),
    )


def run_both(world, device_world, cfg, jit_step, jit_reset, q, actions):
    ref = reference.reset(world, q)
    state = jit_reset(device_world, np.int32(q))
    np.testing.assert_array_equal(state.answer[: len(ref.answer)], ref.answer)
    rewards = []
    for action in actions:
        ref, obs, reward, done = reference.step(world, cfg, ref, action)
        padded, n = pad(action, cfg.action_len)
        state, jobs, jlen, jreward, jdone = jit_step(device_world, cfg, state, padded, n)
        jobs = np.asarray(jobs)
        assert jobs[:jlen].tolist() == obs, (vocab.decode(action), vocab.decode(obs))
        assert (jobs[jlen:] == P.PAD).all()
        assert float(jreward) == reward and bool(jdone) == done
        assert int(state.turn) == ref.turn and bool(state.done) == ref.done
        rewards.append(reward)
    return rewards


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_jax_env_matches_reference(world, device_world, cfg, jit_step, jit_reset, data):
    q = data.draw(st.integers(0, world.num_questions - 1))
    if data.draw(st.booleans()):
        ep = expert.expert_episode(world, cfg, q, np.random.default_rng(q), mistake_prob=0.5)
        actions = [t.action for t in ep.turns]
        if data.draw(st.booleans()):
            k = data.draw(st.integers(0, len(actions) - 1))
            actions[k] = data.draw(mutated(st.just(actions[k])))
    else:
        actions = data.draw(st.lists(actions_for(world), min_size=1, max_size=cfg.max_turns + 1))
    run_both(world, device_world, cfg, jit_step, jit_reset, q, actions)
    assert jit_step._cache_size() == 1, "fixed shapes: the step compiles once"


ANSWER = "<think> so </think> <answer> {} </answer>"


@pytest.mark.parametrize("text,kind", [
    ("<think> </think> <search> Anna Berg </search>", "search"),
    ("<think> find the ceo </think> <search> Berg </search> <eos> <|im_end|>", "search"),
    ("<think> so </think> <answer> Veldra </answer>", "answer"),
    ("<search> Anna Berg </search>", "invalid"),  # no think
    ("<think> </think> <search> </search>", "invalid"),  # empty query
    ("<think> </think> <answer> </answer>", "invalid"),  # empty answer
    ("<think> </think> <search> Anna Berg </answer>", "invalid"),  # mismatched close
    ("<think> </think> <search> Anna Berg", "invalid"),  # truncated turn
    ("<think> </think> <search> Anna </search> <search> Berg </search>", "invalid"),  # two
    ("<think> </think> <search> Anna </search> Berg", "invalid"),  # trailing words
    ("<answer> Anna </answer> <think> </think>", "invalid"),  # out of order
    ("<think> <think> </think> <search> Anna </search>", "invalid"),  # nested tag
    ("<think> </think> <search> Anna <pad> </search>", "invalid"),  # pad inside
    ("", "invalid"),
])
def test_parse_action(text, kind):
    ids = enc(text)
    assert reference.parse_action(ids)[0] == kind
    jkind, _, _ = jax_env.parse_action(*pad(ids, 24))
    assert int(jkind) == {"invalid": jax_env.INVALID, "search": jax_env.SEARCH,
                          "answer": jax_env.ANSWER}[kind]


def test_retrieval_full_name_finds_entity_sloppy_may_not(world):
    for e in range(world.num_entities):
        assert reference.retrieve(world, world.name_ids(e)) == e
    wrong = sum(reference.retrieve(world, world.name_ids(e)[-1:]) != e
                for e in range(world.num_entities) if len(world.name_ids(e)) == 2)
    assert wrong > world.num_entities // 4, "a partial name often returns another document"


def test_invalid_until_max_turns_then_noop(world, device_world, cfg, jit_step, jit_reset):
    bad = [enc("<think> </think> <search> Anna")] * (cfg.max_turns + 2)
    rewards = run_both(world, device_world, cfg, jit_step, jit_reset, 0, bad)
    assert rewards == [0.0] * len(bad)
    state = reference.reset(world, 0)
    for _ in range(cfg.max_turns - 1):
        state, obs, _, done = reference.step(world, cfg, state, bad[0])
        assert obs == list(P.INVALID_OBS) and not done
    state, obs, _, done = reference.step(world, cfg, state, bad[0])
    assert done and obs == [] and state.turn == cfg.max_turns


def test_expert_solves_every_question_reference(world, cfg):
    rng = np.random.default_rng(0)
    for q in range(world.num_questions):
        for mistake_prob in (0.0, 0.7):
            ep = expert.expert_episode(world, cfg, q, rng, mistake_prob=mistake_prob)
            assert ep.reward == 1.0 and len(ep.turns) <= cfg.max_turns


def test_expert_solves_sample_jax(world, device_world, cfg, jit_step, jit_reset):
    rng = np.random.default_rng(1)
    for q in rng.choice(world.num_questions, 30, replace=False).tolist():
        ep = expert.expert_episode(world, cfg, q, rng, mistake_prob=0.3)
        rewards = run_both(world, device_world, cfg, jit_step, jit_reset, q,
                           [t.action for t in ep.turns])
        assert rewards[-1] == 1.0 and sum(rewards) == 1.0


def test_wrong_answer_is_not_rewarded(world, cfg):
    ep = expert.expert_episode(world, cfg, 5, np.random.default_rng(0), wrong_answer_prob=1.0)
    assert ep.reward == 0.0


def _batched_episodes(world, cfg, actions: np.ndarray) -> np.ndarray:
    """Play actions [T, Q, A] (full length) on every question with vmap; returns rewards [Q]."""
    step = jax.jit(jax.vmap(jax_env.step, in_axes=(None, None, 0, 0, 0)), static_argnums=1)
    q = jnp.arange(world.num_questions)
    state = jax.vmap(jax_env.reset, in_axes=(None, 0))(world, q)
    total = jnp.zeros(world.num_questions)
    lens = jnp.full(world.num_questions, cfg.action_len, jnp.int32)
    for t in range(actions.shape[0]):
        state, _, _, reward, _ = step(world, cfg, state, jnp.asarray(actions[t]), lens)
        total += reward
    return np.asarray(total)


def test_random_play_almost_never_wins(world, cfg):
    rng = np.random.default_rng(0)
    t, q, a = cfg.max_turns, world.num_questions, cfg.action_len
    noise = rng.integers(0, vocab.VOCAB_SIZE, (t, q, a)).astype(np.int32)
    assert _batched_episodes(world, cfg, noise).mean() < 0.02

    guesses = np.full((t, q, a), P.EOS, np.int32)  # well-formed turns, random entities
    for i in range(t):
        for j in range(q):
            name = world.name_ids(int(rng.integers(world.num_entities)))
            tag = "answer" if rng.random() < 0.3 else "search"
            turn = enc(f"<think> </think> <{tag}>") + name + enc(f"</{tag}>")
            guesses[i, j, : len(turn)] = turn
    assert _batched_episodes(world, cfg, guesses).mean() < 0.02


def test_step_under_vmap_matches_single(world, device_world, cfg, jit_step, jit_reset):
    rng = np.random.default_rng(2)
    qs = rng.choice(world.num_questions, 8, replace=False)
    actions, lens = [], []
    for q in qs.tolist():
        ep = expert.expert_episode(world, cfg, q, rng, mistake_prob=0.5)
        a, n = pad(ep.turns[0].action, cfg.action_len)
        actions.append(a)
        lens.append(n)
    states = jax.vmap(jax_env.reset, in_axes=(None, 0))(device_world, jnp.asarray(qs))
    vstep = jax.jit(jax.vmap(jax_env.step, in_axes=(None, None, 0, 0, 0)), static_argnums=1)
    batched = vstep(device_world, cfg, states, jnp.asarray(np.stack(actions)), jnp.asarray(lens))
    for i, q in enumerate(qs.tolist()):
        state = jit_reset(device_world, np.int32(q))
        single = jit_step(device_world, cfg, state, actions[i], lens[i])
        for b, s in zip(jax.tree.leaves(batched), jax.tree.leaves(single)):
            np.testing.assert_array_equal(np.asarray(b)[i], np.asarray(s))
