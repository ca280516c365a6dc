"""Per-row sampling: every row of a batch with its own temperature, top-k, top-p and key.

sampling.Sampler is one static setting for a whole batch (a jit argument); an engine slot
holds a request with its own, so here they are arrays. The filter is sampling.filter_logits's
rule row by row (temperature, then top-k keeping ties, then top-p on what top-k kept); row i
samples exactly what `sampling.sample(logits[i:i+1], keys[i], Sampler(t_i, k_i, p_i))` does
(tests/test_serving_engine.py checks it).

Shapes: B rows, V vocab, N top logprobs returned.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

TOP_LOGPROBS = 5  # alternatives returned per token (the OpenAI API's maximum for completions)


class RowSampling(flax.struct.PyTreeNode):
    """Per-row settings, each [B]: temperature (0 = greedy), top_k (0 = off), top_p (1 = off),
    seed (uint32: the row's PRNG key is PRNGKey(seed)), step (tokens the row sampled so far:
    the key of this draw is fold_in(PRNGKey(seed), step))."""

    temperature: Any  # jax.Array or a host numpy array
    top_k: Any
    top_p: Any
    seed: Any
    step: Any


class Sampled(flax.struct.PyTreeNode):
    """tokens [B] int32, logprob [B] (log-softmax of the raw logits at the chosen token),
    top_ids / top_logprobs [B, N] (the N most likely tokens of the raw distribution)."""

    tokens: jax.Array
    logprob: jax.Array
    top_ids: jax.Array
    top_logprobs: jax.Array


def filter_rows(
    logits_BV: jax.Array, temperature_B: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array
) -> jax.Array:
    """Temperature-scaled float32 logits [B, V] with each row's top-k / top-p tail at -inf.
    Greedy rows (temperature 0) are scaled by 1 (their filter is unused)."""
    v = logits_BV.shape[-1]
    t = jnp.where(temperature_B > 0, temperature_B, 1.0).astype(jnp.float32)
    x = logits_BV.astype(jnp.float32) / t[:, None]
    desc = -jnp.sort(-x, axis=-1)  # [B, V] descending
    k = jnp.where((top_k_B > 0) & (top_k_B < v), top_k_B, v)
    kth = jnp.take_along_axis(desc, (k - 1)[:, None], axis=-1)  # [B, 1]
    x = jnp.where(x < kth, -jnp.inf, x)
    # top-p over the top-k survivors, as filter_logits does after its top-k.
    desc = jnp.where(jnp.arange(v)[None] < k[:, None], desc, -jnp.inf)
    probs = jax.nn.softmax(desc, axis=-1)
    keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p_B[:, None]
    cutoff = jnp.min(jnp.where(keep, desc, jnp.inf), axis=-1, keepdims=True)
    return jnp.where((top_p_B[:, None] < 1.0) & (x < cutoff), -jnp.inf, x)


def sample_rows(logits_BV: jax.Array, s: RowSampling) -> Sampled:
    """One token per row under its own settings, with the logprobs an API reports."""
    greedy = jnp.argmax(logits_BV, axis=-1)

    def draw() -> jax.Array:
        filtered = filter_rows(logits_BV, s.temperature, s.top_k, s.top_p)
        keys = jax.vmap(lambda seed, n: jax.random.fold_in(jax.random.PRNGKey(seed), n))(
            s.seed, s.step
        )
        drawn = jax.vmap(lambda key, x: jax.random.categorical(key, x[None], axis=-1)[0])(
            keys, filtered
        )
        return drawn.astype(greedy.dtype)

    # A batch of greedy rows skips the sort, the filters and the draws (a decode step's few
    # hundred microseconds on a CPU); any sampled row runs them for all.
    drawn = jax.lax.cond(jnp.any(s.temperature > 0), draw, lambda: greedy)
    tokens = jnp.where(s.temperature > 0, drawn, greedy)
    tokens = tokens.astype(jnp.int32)
    logp = jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1)
    top_lp, top_ids = jax.lax.top_k(logp, min(TOP_LOGPROBS, logp.shape[-1]))
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return Sampled(tokens, chosen, top_ids.astype(jnp.int32), top_lp)
