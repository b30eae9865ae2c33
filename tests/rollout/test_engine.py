"""The multi-turn rollout loop on HopWorld: slot arrays are consistent with the env and the model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from toy import TINY_POLICY, tiny_env
from trace_jax.envs.hopworld import HopWorldConfig, protocol, reference
from trace_jax.evaluate import question_pool
from trace_jax.models import ModelConfig
from trace_jax.models.decode import prefill
from trace_jax.rollout import expand as ex
from trace_jax.rollout.engine import SamplingConfig, TurnSpec, append_observation, generate_turn
from trace_jax.rollout.expand import rollout_prompts
from trace_jax.rollout.sampling import _first_argmax, categorical, sample_tokens, token_logprobs
from trace_jax.sharding import init_policy
from float32 import assert_float32_close


@pytest.fixture(scope="module")
def setup():
    wcfg = HopWorldConfig(seed=1, num_entities=64, num_questions=40, max_turns=5)
    env = tiny_env(wcfg)
    model = init_policy(TINY_POLICY, seed=0)
    questions = np.arange(8)
    tree = rollout_prompts(model, env, question_pool(env, questions), jax.random.key(0), sampling=SamplingConfig(),
                           pad_id=protocol.PAD)
    return env, model, questions, jax.device_get(tree)


def test_episodes_replay_identically_in_the_reference_env(setup):
    """Cut each slot into (action, observation) turns and replay the actions through reference.step."""
    env, _, questions, tree = setup
    assert tree.done.all()
    for s, q in enumerate(questions):
        toks, mask = tree.tokens[s], tree.policy_mask[s]
        state = reference.reset(env.world, int(q))
        start = int(tree.prompt_len[s])
        assert not mask[:start].any()
        for t in range(int(tree.num_turns[s])):
            end = int(tree.boundaries[s, t])
            turn, turn_mask = toks[start:end].tolist(), mask[start:end]
            n_act = int(turn_mask.sum())
            assert turn_mask[:n_act].all() and not turn_mask[n_act:].any()  # action, then observation
            state, obs, reward, done = reference.step(env.world, env.cfg, state, turn[:n_act])
            assert turn[n_act:] == obs
            start = end
        assert done and reward == tree.reward[s]
        assert start == tree.length[s]
        assert (toks[start:] == protocol.PAD).all() and not mask[start:].any()


def test_model_tokens_count_generated_and_observation(setup):
    """Prompts are prefilled once in the pool; each slot then feeds exactly its own new tokens."""
    _, _, _, tree = setup
    np.testing.assert_array_equal(tree.model_tokens, tree.length - tree.prompt_len)


def test_success_readings_exist_exactly_where_turns_were_observed(setup):
    _, _, _, tree = setup
    assert ((tree.success[:, 0] >= 0) & (tree.success[:, 0] <= 1)).all()
    for s in range(tree.num_slots):
        n = int(tree.num_turns[s])
        # every turn but a final one (answer, no observation) has a reading
        read = tree.success[s, 1:] >= 0
        assert read[: n - 1].all() and not read[n:].any()


def test_same_key_same_rollout_and_logprobs_match_the_model(setup):
    env, model, questions, tree = setup
    again = rollout_prompts(model, env, question_pool(env, questions), jax.random.key(0),
                            sampling=SamplingConfig(), pad_id=protocol.PAD)
    np.testing.assert_array_equal(again.tokens, tree.tokens)
    # Sampled log-probs equal a fresh full forward over the finished sequences.
    logits = model(jnp.asarray(tree.tokens)).logits
    target = token_logprobs(logits[:, :-1], jnp.asarray(tree.tokens[:, 1:]))
    mask = tree.policy_mask[:, 1:]
    np.testing.assert_allclose(np.asarray(target)[mask], tree.logprobs[:, 1:][mask], atol=2e-4)


def test_a_turn_leaves_its_last_token_to_the_observation_forward(setup):
    """A turn of A tokens takes A - 1 decode steps (the draws of a turn's first token and its last need none); the
    observation's forward feeds the last one first. After it every slot's cache holds its whole tree, key for key as
    a fresh prefill of its tokens, and its next logits are read at its last token: the observation's last, or the
    action's last where a slot got no observation (a continuing slot with obs_len 0)."""
    env, model, questions, _ = setup
    rows, action_len = 4, 5
    pool = question_pool(env, questions[:rows])
    ro = ex.start_roots(model, env, pool, ex.prefill_pool(model, pool), jnp.arange(rows, dtype=jnp.int32),
                        jax.random.split(jax.random.key(5), rows), pad_id=protocol.PAD)
    spec = TurnSpec(action_len=action_len, obs_len=env.obs_len, max_turns=env.max_turns, stop_ids=())
    turn = jax.jit(lambda ro: generate_turn(model, ro, spec=spec, sampling=SamplingConfig()))
    after, _, action_len_of = turn(ro)
    np.testing.assert_array_equal(action_len_of, action_len)
    assert int(after.fed_positions - ro.fed_positions) == rows * (action_len - 1)  # one-token forwards
    assert int(after.decode_steps) == action_len  # the loop's iterations: one a draw
    np.testing.assert_array_equal(after.cache.lengths, after.tree.length - 1)
    assert after.pending.all()

    obs_len = jnp.asarray([3, 0, env.obs_len, 1], jnp.int32)
    obs = jnp.asarray(np.random.default_rng(0).integers(4, 40, (rows, env.obs_len)), jnp.int32)
    no = jnp.zeros((rows,), bool)
    closed = jax.jit(lambda ro, *a: append_observation(model, ro, *a))(after, obs, obs_len, no.astype(jnp.float32), no)
    tree = jax.device_get(closed.tree)
    np.testing.assert_array_equal(closed.cache.lengths, tree.length)
    assert not closed.pending.any()
    fresh = prefill(model, jnp.asarray(tree.tokens), jnp.asarray(tree.length), tree.max_len)
    for s in range(rows):
        n = int(tree.length[s])
        for got, want in zip(closed.cache.k + closed.cache.v, fresh.cache.k + fresh.cache.v):
            assert_float32_close(got[s, :, :n], want[s, :, :n])  # decoded one token at a time vs prefilled
    assert_float32_close(closed.logits, fresh.logits)  # at each row's last token
    assert (np.abs(np.asarray(fresh.logits[1] - fresh.logits[0])) > 1e-3).any()  # rows differ: a check that bites


def test_top_p_keeps_only_the_nucleus():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keys = jax.random.split(jax.random.key(0), 400)
    toks = jax.vmap(lambda k: sample_tokens(logits, k[None], 1.0, 0.75)[0][0])(keys)
    assert set(np.unique(toks).tolist()) == {0, 1}
    greedy, _ = sample_tokens(logits, keys[:1], 0.0, 1.0)
    assert int(greedy[0]) == 0


@pytest.mark.parametrize("rows", [1, 6, 32])
def test_top_p_of_a_peaked_distribution_samples_its_mode(rows):
    """One token holds ~99% of the mass: the nucleus is that token alone, at any batch size, jitted (a cutoff taken
    from one computation of the log-probs and compared with another once masked every token: token 0 came out)."""
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(rows, 160)) * 3, jnp.float32).at[:, 5].set(25.0)
    keys = jax.random.split(jax.random.key(1), rows)
    tokens, logp = jax.jit(sample_tokens, static_argnums=(2, 3))(logits, keys, 0.7, 0.9)
    np.testing.assert_array_equal(tokens, 5)
    assert (np.asarray(logp) > -0.1).all()


@pytest.mark.parametrize("vocab", [2, 128, 129, 165, 1000, 32768])
def test_categorical_draws_jax_categoricals_tokens(vocab):
    """The sampler's Gumbel-max draws the very tokens of `jax.random.categorical` under the same keys (so every
    recorded run samples what it sampled before): flat, peaked and top-p-masked logits, one row and many."""
    rng = np.random.default_rng(vocab)
    reference = jax.jit(jax.vmap(jax.random.categorical))
    for trial, (rows, scale, masked) in enumerate([(1, 1.0, False), (7, 30.0, False), (64, 3.0, True)]):
        keys = jax.vmap(jax.random.fold_in)(jax.random.split(jax.random.key(trial), rows), jnp.arange(rows))
        logits = rng.normal(size=(rows, vocab)).astype(np.float32) * scale
        if masked:  # what top-p leaves: most entries -inf, the best one kept
            logits = np.where(rng.random((rows, vocab)) < 0.7, -np.inf, logits)
            logits[:, vocab // 2] = 0.0
        want = np.asarray(reference(keys, logits))
        np.testing.assert_array_equal(np.asarray(jax.jit(categorical)(keys, logits)), want)
    raw = jax.random.split(jax.random.PRNGKey(0), 3)  # raw uint32 keys: JAX's own path
    np.testing.assert_array_equal(categorical(raw, logits[:3]), reference(raw, logits[:3]))


def test_first_argmax_is_argmax_with_ties_across_blocks():
    z = np.zeros((4, 300), np.float32)
    z[0, [7, 200]] = 2.0  # ties in two blocks: the earlier wins
    z[1, [130, 131, 299]] = 5.0
    z[2, :] = -np.inf  # nothing but -inf: index 0, as argmax
    z[3, [5, 260]] = np.nan  # NaN counts as the maximum, the first one
    np.testing.assert_array_equal(_first_argmax(jnp.asarray(z)), jnp.argmax(jnp.asarray(z), axis=-1))
    np.testing.assert_array_equal(_first_argmax(jnp.asarray(z)), [7, 130, 0, 5])


def test_the_head_runs_at_one_position_per_row():
    """The prompts' prefill and an observation chunk need next-token logits at each row's last real token only:
    XLA's FLOP count of either compiled call stays below the output head over every position it feeds (a vocabulary
    of 4096 over a width of 16, so the head dominates and a head at every position would show)."""
    env = tiny_env()
    cfg = ModelConfig(vocab_size=4096, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=8)
    graphdef, params = nnx.split(init_policy(cfg, seed=0))
    pool = question_pool(env, np.arange(4))
    rows, width = pool.tokens.shape

    def flops(fn, *args) -> float:
        """XLA's FLOPs of fn(policy, *args) compiled for the arguments' shapes."""
        cost = jax.jit(lambda p, *a: fn(nnx.merge(graphdef, p), *a)).lower(params, *args).compile().cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    def head(positions: int) -> int:
        return 2 * positions * cfg.hidden_size * cfg.vocab_size

    assert flops(ex.prefill_pool, pool) < head(rows * width) / 2
    def start(policy):
        return ex.start_roots(policy, env, pool, ex.prefill_pool(policy, pool), jnp.arange(rows, dtype=jnp.int32),
                              jax.random.split(jax.random.key(0), rows), pad_id=protocol.PAD)

    roots = jax.eval_shape(lambda p: start(nnx.merge(graphdef, p)), params)
    obs = jnp.ones((rows, env.obs_len), jnp.int32)
    lens, zeros = jnp.full((rows,), env.obs_len, jnp.int32), jnp.zeros((rows,), bool)
    assert flops(append_observation, roots, obs, lens, zeros.astype(jnp.float32), zeros) < head(rows * env.obs_len) / 2
