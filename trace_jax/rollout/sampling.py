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
        # Keep the smallest prefix (by rank) whose mass reaches top_p, always at least the best token. Ranks, not a
        # cutoff value: XLA may compute logp twice with different rounding, and a value compared with a cutoff
        # taken from the other copy can then drop every token.
        order = jnp.argsort(-logp, axis=-1)  # [S, V] token ids, most likely first
        p_sorted = jnp.exp(jnp.take_along_axis(logp, order, axis=-1))
        keep_sorted = jnp.cumsum(p_sorted, axis=-1) - p_sorted < top_p
        keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logp.shape[0])[:, None], order].set(keep_sorted)
        masked = jnp.where(keep, logp, -jnp.inf)
    tokens = jax.vmap(jax.random.categorical)(keys, masked).astype(jnp.int32)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
