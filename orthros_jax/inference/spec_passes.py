"""The two model passes of self-speculative decoding (speculative.py): the verify pass of each
arm; the draft step is drivers.decode with draft_window.

Shapes: B rows, L = k + 1 tokens verified per row, S cache slots, V vocab.

  verify_folded   Orthros: the base stream of the last drafted token (a one-token chunk
                  writing its K/V: the round's last draft step, folded in) and L output copies
                  at positions start .. start + L - 1 over the whole cache, in one pass (every
                  other base K/V, written exactly by the draft steps, stays), like SFT's output
                  stream. A separate draft step for that token would cost a pass of its own and
                  an output copy whose draft is never used.
  verify_rewrite  a single-stream arm (MagicDec-style): the L tokens run again through every
                  layer as a prefill chunk at start, attending the whole cache, and rewrite
                  their K/V (the windowed draft wrote approximate ones).
Both return float32 logits [B, L, V]: position start + j's predicts the token after it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.inference import drivers as fwd
from orthros_jax.inference.cache import KVCache
from orthros_jax.layers import stack
from orthros_jax.layers.cache_view import SlotView, slot_segments
from orthros_jax.layers.kind import CHUNK, Params, StepContext, Stream
from orthros_jax.model import final_logits


def _positions(start_B: jax.Array, length: int) -> jax.Array:
    return start_B[:, None] + jnp.arange(length, dtype=jnp.int32)  # [B, L]


def verify_folded(
    params: Params,
    cache: KVCache,
    tokens_BL: jax.Array,
    start_B: jax.Array,
    last_B: jax.Array,
    *,
    cfg: ModelConfig,
    impl: fwd.Impl | None = None,
) -> tuple[jax.Array, KVCache]:
    """Orthros's verify pass: the base stream of tokens_BL[:, -1] at start + L - 1 (rows where
    last_B; the cache holds every earlier token's K/V) and the output copies of tokens_BL at
    start .. start + L - 1, each layer writing that token's K/V before its copies read the
    cache slots < the new lengths at or before their positions. Returns (logits [B, L, V], the
    cache with lengths + last_B)."""
    s = cache.max_len
    pos = _positions(start_B, tokens_BL.shape[1])
    last = pos[:, -1:]  # [B, 1]
    end = cache.lengths + last_B.astype(jnp.int32)
    view = SlotView(
        fwd.window_before(last[:, 0], min(cfg.window, s)),
        slot_segments(jnp.arange(s)[None] < end[:, None]),
        jnp.where(last_B[:, None], last, s),  # the other rows write nothing (slot S: dropped)
    )
    ctx = StepContext(mode=CHUNK, impl=impl or cfg.attention_impl, view=view, valid=last_B[:, None])
    base = Stream(fwd.embed(params, tokens_BL[:, -1:], cfg), last, jnp.ones_like(last))
    out = Stream(fwd.embed(params, tokens_BL, cfg), pos, jnp.ones_like(pos))
    _, out, states = stack.layer_loop(
        params, cfg, (base, out, cache.states), fwd._stepper(cfg, ctx), by_index=True
    )
    return final_logits(params, out.x, cfg), cache.with_states(states, end)


def verify_rewrite(
    params: Params,
    cache: KVCache,
    tokens_BL: jax.Array,
    start_B: jax.Array,
    valid_BL: jax.Array,
    *,
    cfg: ModelConfig,
    impl: fwd.Impl | None = None,
) -> tuple[jax.Array, KVCache]:
    """A single-stream arm's verify pass: tokens_BL (valid_BL of them, a prefix per row) through
    every layer at start .. start + L - 1, writing their K/V; the cache's lengths become
    start + valid tokens."""
    s = cache.max_len
    pos = _positions(start_B, tokens_BL.shape[1])
    end = start_B + valid_BL.sum(axis=1, dtype=jnp.int32)
    slots = jnp.where(valid_BL, pos, s)  # padding -> slot S: dropped
    # A causal arm reads no window (its queries read the global keys); a windowed one its W-1.
    w = min(cfg.base_window or 1, s)
    view = SlotView(
        fwd.window_before(pos[:, 0], w), slot_segments(jnp.arange(s)[None] < end[:, None]), slots
    )
    ctx = StepContext(mode=CHUNK, impl=impl or cfg.attention_impl, view=view, valid=valid_BL)
    base = Stream(fwd.embed(params, tokens_BL, cfg), pos, jnp.ones_like(pos))
    base, _, states = stack.layer_loop(
        params, cfg, (base, None, cache.states), fwd._stepper(cfg, ctx), by_index=True
    )
    return final_logits(params, base.x, cfg), cache.with_states(states, end)
