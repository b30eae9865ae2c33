"""The inverse-CDF draw against a NumPy inverse CDF given the same uniforms, its distribution, its edges (never a
token of probability 0), and through the engine at the sampling knobs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from toy import TINY_POLICY, tiny_env
from trace_jax.envs.hopworld import HopWorldConfig, protocol
from trace_jax.evaluate import question_pool
from trace_jax.rollout.engine import SamplingConfig
from trace_jax.rollout.expand import rollout_prompts
from trace_jax.rollout.sampling import _inverse_cdf, sample_tokens, token_logprobs
from trace_jax.sharding import init_policy

U_MAX = np.nextafter(np.float32(1), np.float32(0))  # the largest uniform jax.random.uniform returns


def numpy_inverse_cdf(logits: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [S], each row's distance from u to the nearest CDF step [S]) in float64."""
    p = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
    cdf = np.cumsum(p / p.sum(-1, keepdims=True), axis=-1)
    tokens = np.array([np.searchsorted(c, x, side="right") for c, x in zip(cdf, u)])
    return tokens, np.abs(cdf - u[:, None]).min(-1)


@pytest.mark.parametrize("vocab", [2, 165, 1024, 1025, 5000, 32768])
def test_inverse_cdf_is_numpys_inverse_cdf(vocab):
    """Token for token, on one level (V <= 1024) and two (blocks of 128, a partial last block), flat, peaked and
    top-p-masked logits; rows whose u lies within 2e-6 of a CDF step (float32 prefix sums may round either way) are
    left out (at most a quarter)."""
    rng = np.random.default_rng(vocab)
    for rows, scale, masked in [(64, 1.0, False), (64, 6.0, False), (64, 3.0, True)]:
        logits = rng.normal(size=(rows, vocab)).astype(np.float32) * scale
        if masked:  # what top-p leaves: most entries -inf, the best one kept
            logits = np.where(rng.random((rows, vocab)) < 0.7, -np.inf, logits)
            logits[:, vocab // 2] = 0.0
        u = rng.random(rows).astype(np.float32)
        want, margin = numpy_inverse_cdf(logits, u)
        got = np.asarray(jax.jit(_inverse_cdf)(logits, u))
        clear = margin > 2e-6  # CDF steps at V = 32768 are about 3e-5 apart
        assert clear.mean() > 0.75
        np.testing.assert_array_equal(got[clear], want[clear])
        assert np.isfinite(logits[np.arange(rows), got]).all()


@pytest.mark.parametrize("vocab", [165, 5000])
def test_inverse_cdf_at_the_uniforms_ends_draws_the_first_and_last_possible_tokens(vocab):
    """u = 0 draws the first token of positive probability, the largest u the last, even where -inf fills whole
    blocks before and after them (rounding that leaves u x total past every prefix sum must not fall off the end)."""
    logits = np.full((3, vocab), -np.inf, np.float32)
    logits[0, [3, 150]] = [0.0, -1.0]
    logits[1, [vocab // 2, vocab // 2 + 1]] = 5.0  # the rest of the row, and its blocks, -inf
    logits[2] = np.random.default_rng(0).normal(size=vocab)
    logits[2, -40:] = -np.inf
    for u, want in ((0.0, [3, vocab // 2, 0]), (U_MAX, [150, vocab // 2 + 1, vocab - 41])):
        got = _inverse_cdf(jnp.asarray(logits), jnp.full((3,), u, jnp.float32))
        np.testing.assert_array_equal(got, want)
    tiny = logits.copy()
    tiny[0, 150] = -80.0  # exp(-80) underflows the block sums' float32 precision next to 1: never drawn
    assert int(_inverse_cdf(jnp.asarray(tiny[:1]), jnp.full((1,), U_MAX, jnp.float32))[0]) == 3


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_inverse_cdf_samples_the_tempered_distribution(temperature):
    """Over 6000 keys the draw's frequencies are the tempered probabilities within 4.5 standard errors, over tokens
    in the first, second and partial last block of V = 5000."""
    vocab, support = 5000, np.array([3, 127, 128, 4000, 4999])
    probs = np.array([0.4, 0.1, 0.2, 0.25, 0.05])
    logits = np.full((1, vocab), -np.inf, np.float32)
    logits[0, support] = np.log(probs) * temperature  # tempered back to probs
    keys = jax.vmap(jax.random.fold_in)(jax.random.split(jax.random.key(3), 6000), jnp.arange(6000))
    draw = jax.jit(lambda k: sample_tokens(jnp.broadcast_to(jnp.asarray(logits), (k.shape[0], vocab)), k,
                                           temperature, 1.0, "inverse_cdf"))
    tokens, logp = draw(keys)
    freq = np.array([(np.asarray(tokens) == t).mean() for t in support])
    assert freq.sum() == 1.0
    np.testing.assert_array_less(np.abs(freq - probs), 4.5 * np.sqrt(probs * (1 - probs) / 6000))
    np.testing.assert_allclose(np.exp(np.asarray(logp)), probs[np.searchsorted(support, tokens)], rtol=1e-5)


def test_inverse_cdf_keeps_only_the_nucleus():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keys = jax.random.split(jax.random.key(0), 400)
    toks = jax.vmap(lambda k: sample_tokens(logits, k[None], 1.0, 0.75, "inverse_cdf")[0][0])(keys)
    assert set(np.unique(toks).tolist()) == {0, 1}


def test_an_unknown_draw_is_refused():
    with pytest.raises(ValueError, match="inverse_cdf"):
        SamplingConfig(draw="multinomial")


def test_the_engine_draws_by_inverse_cdf_at_the_sampling_knobs():
    """Rollouts drawn by inverse CDF at temperature 0.7 and top-p 0.9: the same tokens under the same key, other
    tokens than Gumbel-max's, and the log-probs recorded are the model's at that temperature."""
    env = tiny_env(HopWorldConfig(seed=1, num_entities=64, num_questions=40, max_turns=5))
    model, pool = init_policy(TINY_POLICY, seed=0), question_pool(env, np.arange(8))
    sampling = SamplingConfig(0.7, 0.9, "inverse_cdf")
    tree, again, gumbel = (jax.device_get(rollout_prompts(model, env, pool, jax.random.key(0), sampling=s,
                                                          pad_id=protocol.PAD))
                           for s in (sampling, sampling, SamplingConfig(0.7, 0.9)))
    np.testing.assert_array_equal(again.tokens, tree.tokens)
    assert (gumbel.tokens != tree.tokens).any()
    logits = model(jnp.asarray(tree.tokens)).logits
    target = token_logprobs(logits[:, :-1], jnp.asarray(tree.tokens[:, 1:]), 0.7)
    mask = tree.policy_mask[:, 1:]
    np.testing.assert_allclose(np.asarray(target)[mask], tree.logprobs[:, 1:][mask], atol=2e-4)
