"""The two model passes of self-speculative decoding (speculative.py): the verify pass of each
arm; the draft step is drivers.decode with draft_window.

Shapes: B rows, L = k + 1 tokens verified per row, S cache slots, V vocab.

  verify_copies   Orthros: L output copies at positions start .. start + L - 1 over the whole
                  cache (read mode: every base K/V, written exactly by the draft steps, stays);
                  one pass, like SFT's output stream.
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
from orthros_jax.layers.kind import CHUNK, READ, Params, StepContext, Stream
from orthros_jax.model import final_logits


def _positions(start_B: jax.Array, length: int) -> jax.Array:
    return start_B[:, None] + jnp.arange(length, dtype=jnp.int32)  # [B, L]


def verify_copies(
    params: Params,
    cache: KVCache,
    tokens_BL: jax.Array,
    start_B: jax.Array,
    *,
    cfg: ModelConfig,
    impl: fwd.Impl | None = None,
) -> jax.Array:
    """Orthros's verify pass: the output copies of tokens_BL at start .. start + L - 1, each over
    the cache slots < cache.lengths at or before its position. Writes nothing."""
    pos = _positions(start_B, tokens_BL.shape[1])
    segments = slot_segments(jnp.arange(cache.max_len)[None] < cache.lengths[:, None])
    # The output stream reads only the global keys; the window view is one (unused) slot.
    view = SlotView(pos[:, -1:], segments)
    ctx = StepContext(mode=READ, impl=impl or cfg.attention_impl, view=view)
    out = Stream(fwd.embed(params, tokens_BL, cfg), pos, jnp.ones_like(pos))
    _, out, _ = stack.layer_loop(
        params, cfg, (None, out, cache.states), fwd._stepper(cfg, ctx), by_index=True
    )
    return final_logits(params, out.x, cfg)


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
