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
shard view of parallel/sequence.py when sequence_parallel.py runs these drivers on each shard of
a slot-split cache with slot_offset).
`impl` overrides cfg.attention_impl (a name or an attend.AttentionImpl, e.g. the benchmark's
floor). Input validation lives in api.py; these functions assume valid inputs.
"""

from __future__ import annotations

import functools
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
from orthros_jax.parallel import sequence as pseq
from orthros_jax.parallel.sequence import SEQ, ShardView

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
    **remote: Any,
) -> Any:
    """This device's cache view, or a sequence shard's (slot_offset: its first global slot;
    remote: the other shards' keys it received, parallel/sequence.ShardView's halo / gathered)."""
    if slot_offset is None:
        return SlotView(window_slots, segments, slots)
    return ShardView(window_slots, segments, slot_offset, slots, **remote)


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
    final = carry[0] if base else carry[1]
    assert final is not None
    return final.x[:, 0]


def prefill(
    params: Params,
    cache: KVCache,
    tokens: jax.Array,
    lengths: jax.Array,
    *,
    cfg: ModelConfig,
    impl: Impl | None = None,
    slot_offset: jax.Array | None = None,
) -> tuple[jax.Array, KVCache]:
    """Prompts of lengths [B] >= 1, written after each row's cache.lengths. Returns (logits
    [B, V] at each prompt's last token, cache).

    tokens [B, T]: the right-padded prompts (T <= C or a multiple of C); they run in chunks of
    C tokens (a lax.scan), each chunk through every layer, its base stream reading the state
    the earlier chunks left (attention: its previous W-1 keys), so memory is the cache plus
    O(C * D) activations. Every arm reads only the last token's output, so the last layer only
    writes its state; the last token then runs a read pass.
    slot_offset: sequence parallelism (inside shard_map, impl "sequence"; see
    inference/sequence_parallel.py): the cache holds this shard's S slots, the first at this
    global slot id, and tokens [B, S] are the tokens at those slots (prompt token i of row b at
    slot cache.lengths[b] + i). The shard runs its slots layer by layer, each layer over its
    chunks that hold a prompt token, after receiving the keys of the other shards the layer
    reads (the W-1 slots before it by halo exchange, or every slot all-gathered when the base
    stream is global); each row's last token is broadcast from the shard holding it.
    """
    impl = impl or cfg.attention_impl
    bsz, t = tokens.shape
    shard = slot_offset is not None
    s, w = cache.max_len, cfg.window
    chunk = min(cfg.prefill_chunk, t)
    n_chunks = -(-t // chunk)
    # One device: blocks of one chunk. A shard: one block of all its chunks, layer by layer
    # (its first chunk needs the previous shard's last keys of the same layer).
    width = n_chunks * chunk if shard else chunk
    tokens = jnp.pad(tokens, ((0, 0), (0, n_chunks * chunk - t)))
    start = cache.lengths  # rows may already hold a prefix (continued prefill)
    end = start + lengths
    slot_ids, _ = _slots_and_window(cache, cfg, slot_offset)
    slot_seg = slot_segments(slot_ids[None] < end[:, None])
    first_slot = 0 if slot_offset is None else slot_offset
    # tokens[b, i] is the token at position origin[b] + i.
    origin = start if slot_offset is None else jnp.broadcast_to(slot_offset, (bsz,))
    last_kind = stack.KINDS[cfg.layer_types[-1]]
    # A single-stream arm whose last layer cannot run its last token alone runs it in full.
    last_in_chunks = not cfg.two_streams and not last_kind.reads_last_token

    def grid(idx: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Positions [B, L] of token columns idx [L] and which hold a prompt token."""
        pos = origin[:, None] + idx
        return pos, (pos >= start[:, None]) & (pos < end[:, None]) & (idx < t)

    def run_block(carry: Any, b0: jax.Array) -> tuple[Any, None]:
        """Columns [b0, b0 + width) of tokens through every layer."""
        states, last_x = carry
        x = embed(params, jax.lax.dynamic_slice_in_dim(tokens, b0, width, 1), cfg)

        def run(
            carry: Any,
            kind: LayerKind,
            p: Params,
            li: Any,
            first: Any,
            size: int,
            compute_base: bool,
            **remote: Any,
        ) -> tuple[jax.Array, Any]:
            """(x, states) after the step over columns [first, first + size) of the block."""
            x, states = carry
            whole = size == width
            pos, valid = grid(b0 + first + jnp.arange(size, dtype=jnp.int32))
            slots = jnp.where(valid, pos - first_slot, s)  # padding, other shards' -> S: dropped
            view = _view(window_before(pos[:, 0], w), slot_seg, slots, slot_offset, **remote)
            ctx = StepContext(mode=CHUNK, impl=impl, view=view, valid=valid)
            xc = x if whole else jax.lax.dynamic_slice_in_dim(x, first, size, 1)
            base = Stream(xc, pos, jnp.ones_like(pos))
            new, _, st = kind.step(p, cfg, base, None, states[kind.name], li, ctx, compute_base)
            if compute_base:
                assert new is not None
                x = new.x if whole else jax.lax.dynamic_update_slice_in_dim(x, new.x, first, 1)
            return x, {**states, kind.name: st}

        def chunks(
            carry: Any, kind: LayerKind, p: Params, li: Any, compute_base: bool, **remote: Any
        ) -> Any:
            if width == chunk:
                return run(carry, kind, p, li, 0, chunk, compute_base, **remote)
            # Only chunks holding a prompt token of some row run (a short prompt in a long cache).
            has = grid(b0 + jnp.arange(width, dtype=jnp.int32))[1]
            has = has.reshape(bsz, -1, chunk).any(axis=(0, 2))
            lo = jnp.where(has.any(), jnp.argmax(has), 0)
            hi = jnp.where(has.any(), has.size - jnp.argmax(has[::-1]), 0)
            body = lambda c, xs: run(xs, kind, p, li, c * chunk, chunk, compute_base, **remote)
            return jax.lax.fori_loop(lo, hi, body, carry)

        def layer(carry: Any, kind: LayerKind, p: Params, li: Any) -> Any:
            # A shard first writes what other shards read of this layer, then receives theirs.
            remote: dict[str, Any] = {}
            if slot_offset is None:
                pass
            elif cfg.base_window is None:  # global: every slot, all-gathered
                carry = chunks(carry, kind, p, li, False)
                remote["gathered"] = pseq.gathered_keys(carry[1][kind.name], li, end)
            elif w > 1:  # the window: the W-1 slots before the shard, by halo exchange
                tail = min(w - 1, s)
                carry = run(carry, kind, p, li, s - tail, tail, False)
                remote["halo"] = pseq.halo_keys(carry[1][kind.name], li, slot_offset, w - 1, end)
            return chunks(carry, kind, p, li, True, **remote)

        def last(carry: Any, kind: LayerKind, p: Params, li: Any) -> Any:
            if last_in_chunks:
                return layer(carry, kind, p, li)
            return chunks(carry, kind, p, li, False)  # base output dead: the state only

        x, states = stack.layer_loop(params, cfg, (x, states), layer, by_index=True, last=last)
        if not cfg.two_streams:  # each row's last prompt token at the last layer's input/output
            idx = end - 1 - origin - b0
            here = (idx >= 0) & (idx < width) & (idx + b0 < t)
            got = jnp.take_along_axis(x, jnp.clip(idx, 0, width - 1)[:, None, None], axis=1)
            last_x = jnp.where(here[:, None], got[:, 0], last_x)
        return (states, last_x), None

    last_x = jnp.zeros((bsz, cfg.d_model), cfg.jnp_dtype)
    blocks = jnp.arange(0, n_chunks * chunk, width, dtype=jnp.int32)
    if blocks.size == 1:
        (states, last_x), _ = run_block((cache.states, last_x), blocks[0])
    else:
        (states, last_x), _ = jax.lax.scan(run_block, (cache.states, last_x), blocks)
    cache = cache.with_states(states, end)
    # Each row's last prompt token: its column, on the sequence shard holding it.
    idx = end - 1 - origin
    mine = (idx >= 0) & (idx < t)
    read = functools.partial(read_pass, params, cfg, cache, impl=impl, slot_offset=slot_offset)
    if cfg.two_streams:  # the output stream runs once, after every layer's cache is filled
        last_tok = jnp.take_along_axis(tokens, jnp.clip(idx, 0, t - 1)[:, None], axis=1)[:, 0]
        x0 = embed(params, _from_owner(last_tok, mine, shard)[:, None], cfg)[:, 0]
        last_x = read(x0, base=False, last_only=False)
    else:
        last_x = _from_owner(last_x, mine, shard)
        if not last_in_chunks:
            last_x = read(last_x, base=True, last_only=True)
    return logits_of(params, last_x, cfg), cache


def _from_owner(x: jax.Array, mine_B: jax.Array, shard: bool) -> jax.Array:
    """x [B, ...] of each row from the sequence shard where mine is set (one device: x)."""
    if not shard:
        return x
    mine = mine_B.reshape(mine_B.shape + (1,) * (x.ndim - 1))
    return jax.lax.psum(jnp.where(mine, x, 0), SEQ)


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
    slots, O(draft_window), with the draft scale-offsets where the model has them
    (cfg.draft_scale_offset); the base stream's window and its K/V writes are unchanged.
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
    ctx = StepContext(
        mode=DECODE, impl=impl, view=view, valid=active[:, None], draft_window=draft_window
    )
    x = embed(params, tokens[:, None], cfg)
    base = Stream(x, pos[:, None], jnp.ones((cache.batch_size, 1), jnp.int32))
    out = base if cfg.two_streams else None
    body = _stepper(cfg, ctx)
    base, out, states = stack.layer_loop(
        params, cfg, (base, out, cache.states), body, by_index=True
    )
    final = out if cfg.two_streams else base
    assert final is not None
    cache = cache.with_states(states, pos + active.astype(jnp.int32))
    return logits_of(params, final.x[:, 0], cfg), cache


prefill_jit = jax.jit(prefill, static_argnames=("cfg", "impl"), donate_argnames=("cache",))
decode_jit = jax.jit(decode, static_argnames=("cfg", "impl"), donate_argnames=("cache",))
