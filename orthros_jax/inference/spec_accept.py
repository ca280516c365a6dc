"""The acceptance rules of self-speculative decoding (speculative.py): which drafts a round
keeps and which token follows them, the per-row keys of a round's extra draws, and the API's
log-probs of the emitted tokens.

Shapes: B rows, k drafts, L = k + 1 verified positions, V vocab.

  greedy    d_j is kept while it is the verifier's argmax at its position; the emitted tokens
            are the argmaxes themselves.
  sampling  d_j is kept with probability min(1, p_j(d_j) / q_j(d_j)); the first rejection is
            resampled from norm(max(0, p - q)); after k acceptances a bonus token comes from
            p_{k+1}. Every emitted token is then distributed exactly as plain decode's (p and
            q: the sampler's filtered distributions).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthros_jax.inference.sampling import TOP_LOGPROBS, RowSampling, Sampled, filter_rows

# Salts folded into a step's key for the draws a round adds to plain decode's one draw.
DRAFT, ACCEPT = 1, 2


def keys(seed_B: jax.Array, step_B: jax.Array, salt: int) -> jax.Array:
    """[B] keys of each row's step, salted (0: plain decode's key itself)."""

    def one(seed: jax.Array, step: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.PRNGKey(seed), step)
        return key if salt == 0 else jax.random.fold_in(key, salt)

    return jax.vmap(one)(seed_B, step_B)


def categorical(keys_B: jax.Array, logits_BV: jax.Array) -> jax.Array:
    draw = lambda key, x: jax.random.categorical(key, x[None], axis=-1)[0]
    return jax.vmap(draw)(keys_B, logits_BV).astype(jnp.int32)


def filtered(logits_BLV: jax.Array, rows: RowSampling) -> jax.Array:
    """float32 [B, L, V]: filter_rows with each row's settings on each of its L positions."""
    b, length, v = logits_BLV.shape
    rep = lambda a: jnp.repeat(a, length)
    flat = filter_rows(
        logits_BLV.reshape(b * length, v), rep(rows.temperature), rep(rows.top_k), rep(rows.top_p)
    )
    return flat.reshape(b, length, v)


def _leading(ok_Bk: jax.Array) -> jax.Array:
    """[B] how many leading entries of each row are True."""
    return jnp.cumprod(ok_Bk, axis=1).sum(axis=1, dtype=jnp.int32)


def accept_greedy(
    drafts_Bk: jax.Array, p_logits_BLV: jax.Array, k_B: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """_accept for a greedy batch: the drafts while they are the verifier's argmax; the emitted
    tokens are the argmaxes themselves (an accepted draft is one)."""
    k = drafts_Bk.shape[1]
    best = jnp.argmax(p_logits_BLV, axis=-1).astype(jnp.int32)  # [B, L]
    n = _leading((drafts_Bk == best[:, :k]) & (jnp.arange(k) < k_B[:, None]))
    return n, best, jnp.zeros(best.shape, jnp.float32)


def accept(
    drafts_Bk: jax.Array,
    q_BkV: jax.Array,
    p_logits_BLV: jax.Array,
    k_B: jax.Array,
    rows: RowSampling,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(accepted n [B], emitted e [B, L]: d_1 .. d_n then the verifier's token, log-prob of
    each emitted token under p [B, L]). q: the drafts' filtered logits; rows.step: the step of
    d_1. Greedy rows compare argmaxes; sampled rows run the speculative-sampling rule."""
    bsz, k = drafts_Bk.shape
    p_BLV = filtered(p_logits_BLV, rows)
    logp = jax.nn.log_softmax(p_BLV, axis=-1)
    logq = jax.nn.log_softmax(q_BkV, axis=-1)
    at = lambda x, ids: jnp.take_along_axis(x, ids[..., None], axis=-1)[..., 0]
    sampled = rows.temperature > 0
    steps = rows.step[:, None] + jnp.arange(k)  # [B, k]
    u = jax.vmap(lambda s: jax.random.uniform(s, ()))(
        keys(jnp.repeat(rows.seed, k), steps.reshape(-1), ACCEPT)
    ).reshape(bsz, k)
    lp_d, lq_d = at(logp[:, :k], drafts_Bk), at(logq, drafts_Bk)
    ok_sampled = jnp.log(u) <= lp_d - lq_d  # u < p/q
    ok_greedy = drafts_Bk == jnp.argmax(p_logits_BLV[:, :k], axis=-1)
    ok = jnp.where(sampled[:, None], ok_sampled, ok_greedy) & (jnp.arange(k) < k_B[:, None])
    n = _leading(ok)
    # The token after the accepted drafts: from norm(max(0, p - q)) after a rejection, from p
    # after all k_B drafts (a bonus token).
    p_n = jnp.take_along_axis(p_BLV, n[:, None, None], axis=1)[:, 0]
    q_n = jnp.take_along_axis(q_BkV, jnp.minimum(n, k - 1)[:, None, None], axis=1)[:, 0]
    residual = jnp.maximum(jax.nn.softmax(p_n, -1) - jax.nn.softmax(q_n, -1), 0.0)
    rejected = (n < k_B) & (residual.sum(-1) > 0)
    from_ = jnp.where(rejected[:, None], jnp.log(residual), p_n)
    drawn = categorical(keys(rows.seed, rows.step + n, 0), from_)
    greedy = jnp.argmax(jnp.take_along_axis(p_logits_BLV, n[:, None, None], 1)[:, 0], -1)
    nxt = jnp.where(sampled, drawn, greedy.astype(jnp.int32))
    e = jnp.concatenate([drafts_Bk, nxt[:, None]], axis=1)
    e = jnp.where(jnp.arange(k + 1) == n[:, None], nxt[:, None], e)
    lp = jnp.where(sampled[:, None], at(logp, e), 0.0)
    return n, e, lp


def api_logprobs(p_BLV: jax.Array, e_BL: jax.Array) -> Sampled:
    """What an API reports of each emitted token, as sampling.sample_rows does for plain decode:
    logprob [B, L] (log-softmax of the verifier's processed logits at the token), top_ids /
    top_logprobs [B, L, N] (its N most likely tokens); tokens and sample_logprob left to the
    caller."""
    logp = jax.nn.log_softmax(p_BLV, axis=-1)
    top_lp, top_ids = jax.lax.top_k(logp, min(TOP_LOGPROBS, logp.shape[-1]))
    chosen = jnp.take_along_axis(logp, e_BL[..., None], axis=-1)[..., 0]
    return Sampled(e_BL, chosen, chosen, top_ids.astype(jnp.int32), top_lp)
