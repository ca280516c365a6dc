"""Per-row logit processing before sampling: presence / frequency / repetition penalties over a
[B, V] history of token counts kept on device, logit_bias, and min_tokens (end ids masked).

The history (`History`) lives beside the cache, one row per cache row: `counts` [B, V] counts
each row's generated tokens, `in_prompt` [B, V] marks its prompt's tokens. record_prompt adds a
prefill chunk's tokens (a reset row starts empty), record_output a decode step's fed token, so
the logits of a row's (n+1)-th token see its n tokens so far. `apply` is the per-row sampler's
first step; a batch whose rows use none of it skips it (lax.cond). Speculative decoding
(speculative.py) processes a round's L verified positions at once (apply_positions: position j
sees the round's first j + 1 fed tokens recorded) and records the tokens a round kept
(record_outputs), so every emitted token's logits are processed as plain decode's would be.

Rules (vLLM's / the OpenAI API's): repetition_penalty r > 0 divides the positive logits and
multiplies the negative ones of every token in the prompt or the output (1: off);
frequency_penalty f and presence_penalty p subtract f * count + p * (count > 0) over the output;
logit_bias adds its value at its token; min_tokens m sets the row's stop ids to -inf while it has
sampled fewer than m tokens.

Shapes: B rows, V vocab, T prompt tokens, N bias entries, M stop ids (-1 padded), L positions
of a speculative round.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


class Penalties(flax.struct.PyTreeNode):
    """Per-row settings: presence, frequency, repetition, min_tokens [B]; bias_ids [B, N]
    (padding: any id outside [0, V)), bias_values [B, N]; stops [B, M] (-1: none)."""

    presence: Any
    frequency: Any
    repetition: Any
    min_tokens: Any
    bias_ids: Any
    bias_values: Any
    stops: Any


class History(flax.struct.PyTreeNode):
    """counts [B, V] int32 (generated tokens), in_prompt [B, V] bool (prompt tokens)."""

    counts: jax.Array
    in_prompt: jax.Array


def init_history(batch: int, vocab: int) -> History:
    return History(jnp.zeros((batch, vocab), jnp.int32), jnp.zeros((batch, vocab), bool))


def _onehot(ids_BN: jax.Array, vocab: int, valid_BN: jax.Array) -> jax.Array:
    """[B, V] bool: True at each row's valid ids in [0, V)."""
    ok = valid_BN & (ids_BN >= 0) & (ids_BN < vocab)
    ids = jnp.where(ok, ids_BN, vocab)  # out of range: dropped
    rows = jnp.broadcast_to(jnp.arange(ids.shape[0])[:, None], ids.shape)
    return jnp.zeros((ids.shape[0], vocab), bool).at[rows, ids].set(True, mode="drop")


def record_prompt(
    hist: History, tokens_BT: jax.Array, lengths_B: jax.Array, reset_B: jax.Array
) -> History:
    """hist with reset rows emptied, then each row's first lengths[b] tokens marked in_prompt."""
    vocab = hist.counts.shape[1]
    counts = jnp.where(reset_B[:, None], 0, hist.counts)
    valid = jnp.arange(tokens_BT.shape[1])[None] < lengths_B[:, None]
    in_prompt = jnp.where(reset_B[:, None], False, hist.in_prompt)
    return History(counts, in_prompt | _onehot(tokens_BT, vocab, valid))


def record_output(hist: History, tokens_B: jax.Array, fed_B: jax.Array) -> History:
    """hist with each fed row's token counted once more."""
    return record_outputs(hist, tokens_B[:, None], fed_B[:, None])


def record_outputs(hist: History, tokens_BL: jax.Array, fed_BL: jax.Array) -> History:
    """hist with each row's fed tokens (a speculative round's kept ones) counted once more."""
    b, length = tokens_BL.shape
    rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, length))
    ids = jnp.where(fed_BL, tokens_BL, hist.counts.shape[1])  # not fed: dropped
    return hist.replace(counts=hist.counts.at[rows, ids].add(1, mode="drop"))


def in_use(p: Penalties) -> jax.Array:
    """Scalar bool: some row uses a penalty, a bias or min_tokens."""
    return (
        jnp.any(p.presence != 0)
        | jnp.any(p.frequency != 0)
        | jnp.any(p.repetition != 1)
        | jnp.any(p.min_tokens > 0)
        | jnp.any(p.bias_values != 0)
    )


def process(logits_BV: jax.Array, hist: History, p: Penalties, step_B: jax.Array) -> jax.Array:
    x = logits_BV.astype(jnp.float32)
    vocab = x.shape[1]
    r = p.repetition.astype(jnp.float32)[:, None]
    seen = hist.in_prompt | (hist.counts > 0)
    x = jnp.where(seen, jnp.where(x > 0, x / r, x * r), x)
    counts = hist.counts.astype(jnp.float32)
    x = x - p.frequency[:, None] * counts - p.presence[:, None] * (counts > 0)
    rows = jnp.broadcast_to(jnp.arange(x.shape[0])[:, None], p.bias_ids.shape)
    ids = jnp.where((p.bias_ids >= 0) & (p.bias_ids < vocab), p.bias_ids, vocab)
    x = x.at[rows, ids].add(p.bias_values.astype(jnp.float32), mode="drop")
    early = (step_B < p.min_tokens)[:, None]
    stops = _onehot(p.stops, vocab, jnp.ones(p.stops.shape, bool))
    return jnp.where(early & stops, -jnp.inf, x)


def apply(logits_BV: jax.Array, hist: History, p: Penalties, step_B: jax.Array) -> jax.Array:
    """float32 logits [B, V] after each row's penalties, bias and min_tokens mask (step [B]:
    tokens the row has sampled so far); the logits unchanged (as float32) when no row uses any."""
    return jax.lax.cond(
        in_use(p),
        lambda: process(logits_BV, hist, p, step_B),
        lambda: logits_BV.astype(jnp.float32),
    )


def apply_positions(
    logits_BLV: jax.Array, hist: History, p: Penalties, fed_BL: jax.Array, step_B: jax.Array
) -> jax.Array:
    """float32 logits [B, L, V] of L consecutive positions, each processed as plain decode
    processes its step: position j's logits follow fed_BL[:, j] (fed_BL[:, :j + 1] recorded on
    top of hist) and sample the row's token step_B + j. Unchanged when no row uses any."""
    b, length, vocab = logits_BLV.shape

    def each() -> jax.Array:
        seen = jnp.cumsum(jax.nn.one_hot(fed_BL, vocab, dtype=jnp.int32), axis=1)  # [B, L, V]
        flat = History(
            (hist.counts[:, None] + seen).reshape(b * length, vocab),
            jnp.repeat(hist.in_prompt, length, axis=0),
        )
        rep = jax.tree.map(lambda a: jnp.repeat(a, length, axis=0), p)
        steps = (step_B[:, None] + jnp.arange(length)).reshape(-1)
        x = process(logits_BLV.reshape(b * length, vocab), flat, rep, steps)
        return x.reshape(b, length, vocab)

    return jax.lax.cond(in_use(p), each, lambda: logits_BLV.astype(jnp.float32))


def gather(hist: History, rows_P: jax.Array) -> History:
    """Rows [P] of the history (ids >= B clipped: padding reads some row)."""
    return jax.tree.map(lambda a: jnp.take(a, rows_P, axis=0, mode="clip"), hist)


def scatter(hist: History, rows_P: jax.Array, sub: History) -> History:
    """hist with rows [P] replaced by sub's; ids >= B dropped."""
    return jax.tree.map(lambda a, s: a.at[rows_P].set(s, mode="drop"), hist, sub)
