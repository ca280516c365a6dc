"""The cached drivers: chunked prefill and one-token decode over a KVCache (jitted, pure).

Shapes: B batch, T prompt tokens (padded to a bucket), C prefill chunk, S cache slots,
D d_model, V vocab, W window.

Both are drivers over the layer kinds' `step` (layers/kind.py) and the one layer loop
(layers/stack.layer_loop); they compute exactly what the training forward computes:
  orthros      base stream: sliding window, writes every layer's state; its last layer's
               attention/FFN output is dead and skipped. Output stream: one token per row,
               global over the whole cache of each layer; it writes nothing.
  transformer  one stream, global over the cache; logits at each row's last token.
  swa          one stream, sliding window; logits at each row's last token.
Positions are cache slots (cache.py), so masks compare slot indices; attention-like kinds find
their keys through the cache view in the step context (layers/cache_view.SlotView here, the
shard view of parallel/sequence.py when a sequence-parallel driver passes slot_offset).
`impl` overrides cfg.attention_impl (a name or an attend.AttentionImpl, e.g. the benchmark's
floor). Input validation lives in api.py; these functions assume valid inputs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.inference.cache import KVCache
from orthros_jax.layers import primitives as nnl
from orthros_jax.layers import stack
from orthros_jax.layers.attend import AttentionImpl
from orthros_jax.layers.cache_view import SlotView, slot_segments
from orthros_jax.layers.kind import CHUNK, DECODE, READ, LayerKind, Params, StepContext, Stream
from orthros_jax.model import final_logits
from orthros_jax.parallel.sequence import ShardView

Impl = AttentionImpl | str


def embed(params: Params, tokens: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Token ids [B, T] -> [B, T, D] in the activation dtype."""
    return nnl.embed(tokens, params["embedding"], cfg.jnp_dtype)


def logits_of(params: Params, x_BD: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Final norm + LM head on one hidden state per row: [B, D] -> float32 [B, V]."""
    return final_logits(params, x_BD[:, None], cfg)[:, 0]


def _view(
    window_slots: jax.Array,
    segments: jax.Array,
    slots: jax.Array | None,
    slot_offset: jax.Array | None,
) -> Any:
    """This device's cache view, or a sequence shard's (slot_offset: its first global slot)."""
    if slot_offset is None:
        return SlotView(window_slots, segments, slots)
    return ShardView(window_slots, segments, slot_offset, slots)


def _window_ending_at(pos_B: jax.Array, w: int) -> jax.Array:
    """[B, W] slots of the window ending at pos (itself last)."""
    return pos_B[:, None] - (w - 1) + jnp.arange(w, dtype=jnp.int32)


def window_before(pos_B: jax.Array, w: int) -> jax.Array:
    """[B, W-1] slots right before pos: what a chunk starting at pos reads of earlier ones."""
    return _window_ending_at(pos_B - 1, w - 1)


def _stepper(cfg: ModelConfig, ctx: StepContext, compute_base: bool = True) -> stack.LayerBody:
    """A layer_loop body running each kind's step on (base, out, states)."""

    def body(carry: Any, kind: LayerKind, p: Params, li: Any) -> Any:
        base, out, states = carry
        base, out, st = kind.step(p, cfg, base, out, states[kind.name], li, ctx, compute_base)
        return base, out, {**states, kind.name: st}

    return body


def _slots_and_window(
    cache: KVCache, cfg: ModelConfig, slot_offset: jax.Array | None
) -> tuple[jax.Array, int]:
    """Global slot ids [S] of the cache's slots and the window W a query reads. A sequence shard
    (slot_offset given) holds S of more slots, so W is not capped at S there."""
    s = cache.max_len
    if slot_offset is None:
        return jnp.arange(s), min(cfg.window, s)
    return slot_offset + jnp.arange(s), cfg.window


def read_pass(
    params: Params,
    cfg: ModelConfig,
    cache: KVCache,
    x_BD: jax.Array,
    *,
    impl: Impl,
    base: bool,
    last_only: bool,
    slot_offset: jax.Array | None = None,
) -> jax.Array:
    """Queries only, over a filled cache, for the token at slot lengths-1 of each row: the
    orthros output stream through every layer (base=False; with paired MoE routing the base
    token runs again beside it, reading its window, for its experts), or a single-stream arm's last
    prompt token through the last layer only (base=True, last_only=True). Returns [B, D].
    slot_offset: sequence parallelism (inside shard_map, impl "sequence"): the cache holds this
    shard's slots, the first at this global slot id."""
    slot_ids, w = _slots_and_window(cache, cfg, slot_offset)
    pos = cache.lengths - 1
    slot_seg = slot_segments(slot_ids[None] < cache.lengths[:, None])
    view = _view(_window_ending_at(pos, w), slot_seg, None, slot_offset)
    ctx = StepContext(mode=READ, impl=impl, view=view)
    tok = Stream(x_BD[:, None], pos[:, None], jnp.ones((cache.batch_size, 1), jnp.int32))
    streams: tuple[Stream | None, Stream | None] = (tok, None) if base else (None, tok)
    if not base and cfg.moe_routing == "paired":  # the copy routes to its base token's experts
        streams = (tok, tok)
    body = _stepper(cfg, ctx)
    carry = (*streams, cache.states)
    if last_only:
        carry = stack.layer_loop(params, cfg, carry, lambda c, *a: c, by_index=True, last=body)
    else:
        carry = stack.layer_loop(params, cfg, carry, body, by_index=True)
    return (carry[0] if base else carry[1]).x[:, 0]


def prefill(
    params: Params,
    cache: KVCache,
    tokens: jax.Array,
    lengths: jax.Array,
    *,
    cfg: ModelConfig,
    impl: Impl | None = None,
) -> tuple[jax.Array, KVCache]:
    """Right-padded prompts tokens [B, T] (T <= C or a multiple of C), lengths [B] >= 1, written
    after each row's cache.lengths. Returns (logits [B, V] at each prompt's last token, cache).

    The prompt runs in chunks of C tokens (a lax.scan); each chunk's base stream reads the
    state the earlier chunks left (attention: its previous W-1 keys), so memory is the cache
    plus O(C * D) activations. Every arm reads only the last token's output, so the last
    layer only writes its state for the chunk; the last token then runs a read pass.
    """
    impl = impl or cfg.attention_impl
    bsz, t = tokens.shape
    chunk = min(cfg.prefill_chunk, t)
    s, w = cache.max_len, cfg.window
    start = cache.lengths  # rows may already hold a prefix (continued prefill)
    end = start + lengths
    slot_seg = slot_segments(jnp.arange(s)[None] < end[:, None])
    last_kind = stack.KINDS[cfg.layer_types[-1]]
    # A single-stream arm whose last layer cannot run its last token alone runs it in full.
    last_in_chunks = not cfg.two_streams and not last_kind.reads_last_token

    def run_chunk(carry: Any, c: jax.Array) -> tuple[Any, None]:
        states, last_x = carry
        off = c * chunk + jnp.arange(chunk, dtype=jnp.int32)  # [C] offsets into the prompt
        pos = start[:, None] + off  # [B, C] positions = slots
        valid = off < lengths[:, None]
        slots = jnp.where(valid, pos, s)  # padding -> slot S: dropped
        view = SlotView(window_before(pos[:, 0], w), slot_seg, slots)
        ctx = StepContext(mode=CHUNK, impl=impl, view=view, valid=valid)
        x = embed(params, jax.lax.dynamic_slice_in_dim(tokens, c * chunk, chunk, 1), cfg)
        base = Stream(x, pos, jnp.ones_like(pos))
        body = _stepper(cfg, ctx)
        last = _stepper(cfg, ctx, compute_base=last_in_chunks)
        base, _, states = stack.layer_loop(
            params, cfg, (base, None, states), body, by_index=True, last=last
        )
        if not cfg.two_streams:  # each row's last prompt token at the last layer's input/output
            idx = lengths - 1 - c * chunk
            here = (idx >= 0) & (idx < chunk)
            got = jnp.take_along_axis(base.x, jnp.clip(idx, 0, chunk - 1)[:, None, None], axis=1)
            last_x = jnp.where(here[:, None], got[:, 0], last_x)
        return (states, last_x), None

    last_x = jnp.zeros((bsz, cfg.d_model), cfg.jnp_dtype)
    chunks = jnp.arange(t // chunk, dtype=jnp.int32)
    (states, last_x), _ = jax.lax.scan(run_chunk, (cache.states, last_x), chunks)
    cache = cache.with_states(states, end)
    if cfg.two_streams:  # the output stream runs once, after every layer's cache is filled
        last_tok = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
        x0 = embed(params, last_tok[:, None], cfg)[:, 0]
        last_x = read_pass(params, cfg, cache, x0, impl=impl, base=False, last_only=False)
    elif not last_in_chunks:
        last_x = read_pass(params, cfg, cache, last_x, impl=impl, base=True, last_only=True)
    return logits_of(params, last_x, cfg), cache


def decode(
    params: Params,
    cache: KVCache,
    tokens: jax.Array,
    active: jax.Array,
    *,
    cfg: ModelConfig,
    impl: Impl | None = None,
    slot_offset: jax.Array | None = None,
    draft_window: int | None = None,
) -> tuple[jax.Array, KVCache]:
    """tokens [B] at position cache.lengths -> (logits [B, V] for the next token, cache).

    Each row writes its state at its own length. Rows with active=False write nothing and
    keep their length (their logits are garbage): `generate` uses this for rows that stopped.
    Every layer runs inside the one loop, the last included although its base output is dead:
    a cache write after the loop made XLA copy the whole cache every step (docs/performance.md).
    slot_offset: sequence parallelism (inside shard_map, impl "sequence"): the cache holds this
    shard's slots, the first at this global slot id; a token lands only on the shard owning it.
    draft_window: a self-speculative draft step (inference/speculative.py): every global
    query (the output copy; a single-stream arm's attention) reads only the last draft_window
    slots, O(draft_window); the base stream's window and its K/V writes are unchanged.
    """
    s = cache.max_len
    pos = cache.lengths  # [B]
    local = pos if slot_offset is None else pos - slot_offset
    slot_ids, w = _slots_and_window(cache, cfg, slot_offset)
    view = _view(
        # The sliding-window stream reads only its last W slots: O(W).
        _window_ending_at(pos, w),
        slot_segments(slot_ids[None] <= pos[:, None]),
        # inactive rows and other shards' slots -> slot S: dropped
        jnp.where(active & (local >= 0) & (local < s), local, s)[:, None],
        slot_offset,
    )
    if draft_window is not None:
        view = view.replace(global_slots=_window_ending_at(pos, min(draft_window, s)))
    impl = impl or cfg.attention_impl
    ctx = StepContext(mode=DECODE, impl=impl, view=view, valid=active[:, None])
    x = embed(params, tokens[:, None], cfg)
    base = Stream(x, pos[:, None], jnp.ones((cache.batch_size, 1), jnp.int32))
    out = base if cfg.two_streams else None
    body = _stepper(cfg, ctx)
    base, out, states = stack.layer_loop(
        params, cfg, (base, out, cache.states), body, by_index=True
    )
    final = out if cfg.two_streams else base
    cache = cache.with_states(states, pos + active.astype(jnp.int32))
    return logits_of(params, final.x[:, 0], cfg), cache


prefill_jit = jax.jit(prefill, static_argnames=("cfg", "impl"), donate_argnames=("cache",))
decode_jit = jax.jit(decode, static_argnames=("cfg", "impl"), donate_argnames=("cache",))
