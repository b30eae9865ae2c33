"""The policy's sampling distribution: temperature and nucleus (top-p), one PRNG stream per slot.

`policy_logprobs` is the one definition of the distribution the sampler draws from; the trainer
scores tokens with it too, so the importance ratio of an on-policy update is exactly 1 at any
temperature.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def policy_logprobs(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log softmax(logits / temperature) over the last axis, in float32.

    temperature == 0 (greedy) scores the untempered distribution (temperature 1).
    """
    scale = 1.0 if temperature == 0.0 else temperature
    return jax.nn.log_softmax(logits.astype(jnp.float32) / scale, axis=-1)


def token_logprobs(logits: jax.Array, tokens: jax.Array, temperature: float = 1.0) -> jax.Array:
    """log p(tokens) under `policy_logprobs`: logits [..., V], tokens [...] int -> [...] float32."""
    logp = policy_logprobs(logits, temperature)
    return jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: float, top_p: float
                  ) -> tuple[jax.Array, jax.Array]:
    """Sample one token per row. logits [S, V] float32, keys [S] PRNG keys.

    Returns (tokens [S] int32, logprobs [S]): the log-probability of each token under the
    temperature-scaled distribution before the top-p cut (the policy the trainer scores).
    temperature == 0 means greedy.
    """
    logp = policy_logprobs(logits, temperature)
    if temperature == 0.0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    masked = logp
    if top_p < 1.0:
        sorted_logp = jnp.sort(logp, axis=-1)[:, ::-1]
        cum = jnp.cumsum(jnp.exp(sorted_logp), axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least the best token).
        cutoff_idx = jnp.sum(cum - jnp.exp(sorted_logp) < top_p, axis=-1) - 1
        cutoff = jnp.take_along_axis(sorted_logp, cutoff_idx[:, None], axis=-1)
        masked = jnp.where(logp >= cutoff, logp, -jnp.inf)
    tokens = jax.vmap(jax.random.categorical)(keys, masked).astype(jnp.int32)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
