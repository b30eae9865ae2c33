"""Token sampling with temperature and nucleus (top-p), one PRNG stream per slot."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: float, top_p: float
                  ) -> tuple[jax.Array, jax.Array]:
    """Sample one token per row. logits [S, V] float32, keys [S] PRNG keys.

    Returns (tokens [S] int32, logprobs [S]): the log-probability of each token under the
    temperature-scaled distribution before the top-p cut (the policy the trainer scores).
    temperature == 0 means greedy.
    """
    if temperature == 0.0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
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
