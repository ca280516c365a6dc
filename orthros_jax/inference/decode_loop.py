"""The one on-device decode loop, of `generate` (api.py) and of the serving engine's multi-step
decode (serving/device.py); traced inside their jits, the cache donated.

Shapes: B rows, K steps (static), N stop ids per row, V vocab.

    decode_loop(decode, params, cache, tokens [B], budget [B], stops [B, N], sampling,
                steps=K, vocab_size=V, hist=None, pen=None) -> LoopOut

A lax.while_loop of at most K steps of decode(params, cache, tokens [B], active [B]) ->
(logits [B, V], cache) (the single-program driver's or sequence_parallel's), each feeding the
token the step before sampled (the first step feeds `tokens`). Row b runs while it has
budget[b] steps left, has not sampled one of its stop ids (stops, -1 padded; the stop token is
sampled and reported) and has a free cache slot (else it stops with hit_capacity[b] set); other
rows write nothing, and the loop ends early once no row runs. Every step samples with
sampling.sample_rows, row b's draw keyed by its seed and sampling.step[b] plus the steps it
ran, so K does not change what is drawn. With hist / pen (the serving engine's request
penalties, logit bias and min_tokens: logit_processing.py) each step records the fed token in
the row's history and processes the logits before sampling; the history comes back in LoopOut.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.inference import logit_processing as lp
from orthros_jax.inference.cache import KVCache
from orthros_jax.inference.sampling import RowSampling, Sampled, sample_rows
from orthros_jax.layers.kind import Params

Decode = Callable[[Params, KVCache, jax.Array, jax.Array], tuple[jax.Array, KVCache]]


class LoopOut(flax.struct.PyTreeNode):
    """sampled: Sampled with leaves [K, B, ...] (step k's draws; only where fed); fed [K, B]
    (row b ran step k); hit_capacity [B] (row b stopped for want of a cache slot); the cache;
    hist: the logit-processing history (None without one)."""

    sampled: Sampled
    fed: jax.Array
    hit_capacity: jax.Array
    cache: KVCache
    hist: Any = None


class _State(flax.struct.PyTreeNode):
    k: jax.Array  # () steps run
    cache: KVCache
    tok: jax.Array  # [B] the token to feed next
    left: jax.Array  # [B] steps the row may still run (0: it stopped)
    count: jax.Array  # [B] the row's sampling step (tokens it sampled so far)
    hit: jax.Array  # [B] bool
    sampled: Sampled  # buffers [K, B, ...]
    fed: jax.Array  # [K, B]
    hist: Any  # lp.History or None


def decode_loop(
    decode: Decode,
    params: Params,
    cache: KVCache,
    tokens_B: jax.Array,
    budget_B: jax.Array,
    stops_BN: jax.Array,
    sampling: RowSampling,
    *,
    steps: int,
    vocab_size: int,
    logprobs: bool = True,
    hist: lp.History | None = None,
    pen: lp.Penalties | None = None,
) -> LoopOut:
    """At most `steps` decode steps (see the module docstring); logprobs: also the API's
    log-probs (sampling.sample_rows); hist and pen: the rows' logit processing (both or
    neither)."""
    if (hist is None) != (pen is None):
        raise ValueError("decode_loop: give hist and pen together, or neither")
    bsz = tokens_B.shape[0]
    sample = functools.partial(sample_rows, logprobs=logprobs)
    shapes = jax.eval_shape(sample, jax.ShapeDtypeStruct((bsz, vocab_size), jnp.float32), sampling)
    buffers = jax.tree.map(lambda a: jnp.zeros((steps, *a.shape), a.dtype), shapes)

    def body(st: _State) -> _State:
        full = st.cache.lengths >= st.cache.max_len  # no slot left for the token to feed
        fed = (st.left > 0) & ~full
        logits, cache = decode(params, st.cache, st.tok, fed)
        hist = st.hist
        if hist is not None and pen is not None:  # the fed token is the row's latest output
            hist = lp.record_output(hist, st.tok, fed)
            logits = lp.apply(logits, hist, pen, st.count)
        out = sample(logits, sampling.replace(step=st.count))
        stopped = (out.tokens[:, None] == stops_BN).any(axis=-1)
        put = lambda buf, x: buf.at[st.k].set(x)
        return _State(
            k=st.k + 1,
            cache=cache,
            tok=jnp.where(fed, out.tokens, st.tok),
            left=jnp.where(fed & ~stopped, st.left - 1, 0),
            count=st.count + fed.astype(st.count.dtype),
            hit=st.hit | ((st.left > 0) & full),
            sampled=jax.tree.map(put, st.sampled, out),
            fed=put(st.fed, fed),
            hist=hist,
        )

    st = _State(
        k=jnp.zeros((), jnp.int32),
        cache=cache,
        tok=jnp.asarray(tokens_B, jnp.int32),
        left=jnp.asarray(budget_B, jnp.int32),
        count=jnp.asarray(sampling.step, jnp.int32),
        hit=jnp.zeros((bsz,), bool),
        sampled=buffers,
        fed=jnp.zeros((steps, bsz), bool),
        hist=hist,
    )
    if steps == 0:  # nothing to run (e.g. generate's max_new_tokens=1: the prefill's token)
        return LoopOut(st.sampled, st.fed, st.hit, st.cache, st.hist)
    st = jax.lax.while_loop(lambda st: (st.k < steps) & (st.left > 0).any(), body, st)
    return LoopOut(st.sampled, st.fed, st.hit, st.cache, st.hist)
