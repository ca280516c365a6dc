"""The attention layer kind: one step for every mode (see layer_kind.py).

Orthros: K/V come from the base stream only; the base queries attend a window of w keys, the
output stream's queries attend every key at an original position <= their own. Both streams
share every projection, norm and the FFN; each has its own query scale-offset
q = alpha * (x W_Q) + beta ([N, H], applied before RoPE). transformer: one stream, causal over
every key; swa: one stream, the window. The cache state is the head-major K/V of every layer,
k, v [layers, B, K, S, H], written in place at the layer index (no stack slicing).

Per-layer parameters (the stack adds a leading layers axis): the shared block
(layer_kind.block_param_shapes) and wq [D, N, H], wk/wv [D, K, H], wo [N, H, D];
q_norm/k_norm [H] (qk_norm); wq_gate [D, N, H] (attn_output_gate);
so_{base,out}_{scale,offset} [N, H] (orthros with scale_offset).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthros_jax import kv_cache as kvc
from orthros_jax import layers as nnl
from orthros_jax.attend import Keys, attend
from orthros_jax.attention import KEY_PAD_SEGMENT
from orthros_jax.axes import BATCH, EMBED, HEAD_DIM, HEADS, KV_HEADS, LAYERS, LENGTH
from orthros_jax.config import ModelConfig
from orthros_jax.layer_kind import (
    CHUNK,
    DECODE,
    READ,
    SEQUENCE,
    LayerKind,
    Params,
    StepContext,
    Stream,
    block_param_shapes,
    default_init,
    ffn_residual,
    finish_streams,
    norm,
)


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Shape and logical axes of every per-layer parameter (without the leading layers axis)."""
    d, n, k, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    shapes = block_param_shapes(cfg)
    shapes.update(
        wq=((d, n, h), (EMBED, HEADS, HEAD_DIM)),
        wk=((d, k, h), (EMBED, KV_HEADS, HEAD_DIM)),
        wv=((d, k, h), (EMBED, KV_HEADS, HEAD_DIM)),
        wo=((n, h, d), (HEADS, HEAD_DIM, EMBED)),
    )
    if cfg.attn_output_gate:
        shapes["wq_gate"] = ((d, n, h), (EMBED, HEADS, HEAD_DIM))
    if cfg.qk_norm:
        shapes["q_norm"] = ((h,), (HEAD_DIM,))
        shapes["k_norm"] = ((h,), (HEAD_DIM,))
    if cfg.two_streams and cfg.scale_offset:
        for stream in ("base", "out"):
            shapes[f"so_{stream}_scale"] = ((n, h), (HEADS, HEAD_DIM))
            shapes[f"so_{stream}_offset"] = ((n, h), (HEADS, HEAD_DIM))
    return shapes


def layer_kv(p: Params, x: jax.Array, positions: jax.Array, cfg: ModelConfig):
    """K/V of a layer from its base input x [B, L, D]: k (rotated), v [B, L, K, H]."""
    h = norm(p, x, "attn_norm", cfg)
    k = jnp.einsum("bld,dkh->blkh", h, p["wk"].astype(h.dtype))
    v = jnp.einsum("bld,dkh->blkh", h, p["wv"].astype(h.dtype))
    if cfg.qk_norm:
        k = nnl.rms_norm(k, p["k_norm"], cfg.norm_eps, cfg.norm_zero_centered)
    return nnl.apply_rope(k, positions, nnl.rope_inv_freq(cfg)), v


def layer_query(p: Params, x: jax.Array, positions: jax.Array, cfg: ModelConfig, stream: str):
    """Queries [B, L, N, H] of a stream ('base' or 'out'): q = alpha*(x Wq)+beta, then RoPE."""
    h = norm(p, x, "attn_norm", cfg)
    q = jnp.einsum("bld,dnh->blnh", h, p["wq"].astype(h.dtype))
    if cfg.qk_norm:
        q = nnl.rms_norm(q, p["q_norm"], cfg.norm_eps, cfg.norm_zero_centered)
    if cfg.two_streams and cfg.scale_offset:
        q = q * p[f"so_{stream}_scale"].astype(q.dtype) + p[f"so_{stream}_offset"].astype(q.dtype)
    return nnl.apply_rope(q, positions, nnl.rope_inv_freq(cfg))


def layer_finish(p: Params, x: jax.Array, attn: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Output gate (if any), shared W_O + residual, then the FFN + residual. attn [B, L, N, H]."""
    if cfg.attn_output_gate:
        h = norm(p, x, "attn_norm", cfg)
        gate = jnp.einsum("bld,dnh->blnh", h, p["wq_gate"].astype(h.dtype))
        attn = attn * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(attn.dtype)
    mixed = jnp.einsum("blnh,nhd->bld", attn, p["wo"].astype(attn.dtype))
    return ffn_residual(p, x, mixed, cfg)


def _read_slots(ck, cv, li, slots, ctx: StepContext):
    """K/V [B, K, L, H] and segments [B, L] of a layer at global slots [B, L]: from this shard's
    cache, or from ctx.halo for the slots right before the shard; any other slot (negative,
    beyond the cache, another shard's) is padding."""
    s = ctx.slot_segments.shape[1]
    local = slots if ctx.slot_offset is None else slots - ctx.slot_offset
    mine = (local >= 0) & (local < s)
    own_seg = jnp.take_along_axis(ctx.slot_segments, jnp.clip(local, 0, s - 1), 1)
    seg = jnp.where(mine, own_seg, KEY_PAD_SEGMENT)
    k, v = kvc.read(ck, li, local), kvc.read(cv, li, local)
    if ctx.halo is not None:
        h = ctx.halo
        r = h.positions.shape[1]
        idx = slots - h.positions[:, :1]  # the halo holds consecutive slots
        in_halo = (idx >= 0) & (idx < r) & ~mine
        idx = jnp.clip(idx, 0, r - 1)
        sel = in_halo[:, None, :, None]
        k = jnp.where(sel, jnp.take_along_axis(h.k, idx[:, None, :, None], axis=2), k)
        v = jnp.where(sel, jnp.take_along_axis(h.v, idx[:, None, :, None], axis=2), v)
        seg = jnp.where(in_halo, jnp.take_along_axis(h.segment_ids, idx, 1), seg)
    return k, v, seg


def _cache_keys(ck, cv, li, ctx: StepContext, base: Stream | None, kv) -> tuple[Keys, Keys]:
    """(window keys, global keys) of a cached mode. The global keys are the layer's whole
    head-major cache read in place; the window keys are a chunk's own K/V plus the W-1 slots
    before it (chunk), or the W slots ending at the query (decode/read).

    Sequence parallelism (ctx.slot_offset set; the cache holds this shard's slots): decode/read
    keys are split (attend's `sequence` merges the shards); a chunk's own keys are read back
    from the cache after its write (a slot inside the chunk that holds an earlier prompt keeps
    it), its window's slots before the shard come from ctx.halo, and its global queries read
    ctx.gathered (the layer's K/V of every shard) when given."""
    bsz, s = ctx.slot_segments.shape
    sharded = ctx.slot_offset is not None
    first = ctx.slot_offset if sharded else 0
    slot_ids = jnp.broadcast_to(first + jnp.arange(s, dtype=jnp.int32), (bsz, s))
    full = ctx.gathered
    if full is None:
        full = Keys(
            kvc.layer_view(ck, li), kvc.layer_view(cv, li), slot_ids, ctx.slot_segments,
            head_major=True, split=sharded,
        )  # fmt: skip
    win = ctx.window_slots
    wk, wv, win_seg = _read_slots(ck, cv, li, win, ctx)  # [B, K, W, H]
    if ctx.mode == CHUNK:
        if sharded:
            k, v, seg = _read_slots(ck, cv, li, base.positions, ctx)
            k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
        else:
            (k, v), seg = kv, jnp.ones(base.positions.shape, jnp.int32)
        prefix = (jnp.swapaxes(wk, 1, 2), jnp.swapaxes(wv, 1, 2), win, win_seg)
        local = Keys(k, v, base.positions, seg, prefix=prefix, aligned=True)
    else:
        local = Keys(wk, wv, win, win_seg, head_major=True, split=sharded)
    return local, full


def step(
    p: Params,
    cfg: ModelConfig,
    base: Stream | None,
    out: Stream | None,
    state,
    li,
    ctx: StepContext,
    compute_base: bool = True,
):
    """One attention layer for both streams in any mode. Returns (base, out, state)."""
    kv = None
    if base is not None and ctx.mode != READ:
        kv = layer_kv(p, base.x, base.positions, cfg)
    if ctx.mode == SEQUENCE:
        local = full = Keys(
            *kv, base.positions, base.segment_ids, aligned=True,
            default_positions=ctx.default_positions,
        )  # fmt: skip
    else:
        ck, cv = state
        if ctx.mode in (CHUNK, DECODE):
            ck, cv = kvc.write(ck, li, ctx.slots, kv[0]), kvc.write(cv, li, ctx.slots, kv[1])
        state = (ck, cv)
        local, full = _cache_keys(ck, cv, li, ctx, base, kv)
    window = cfg.base_window
    base_attn = None
    if base is not None and compute_base:
        q = layer_query(p, base.x, base.positions, cfg, "base")
        keys = full if window is None else local
        base_attn = attend(ctx.impl, q, base.positions, _q_segments(base, ctx), keys, window, cfg)
    out_attn = None
    if out is not None:
        q_out = layer_query(p, out.x, out.positions, cfg, "out")
        if ctx.out_index is not None:  # SFT copies are not the keys' own queries
            full = full.replace(aligned=False, default_positions=False, q_index=ctx.out_index)
        out_attn = attend(ctx.impl, q_out, out.positions, _q_segments(out, ctx), full, None, cfg)
    # W_O and the FFN are token-wise and shared (decode: both streams as one batch).
    finish = lambda x, a: layer_finish(p, x, a, cfg)
    base, out = finish_streams(base, out, base_attn, out_attn, finish, ctx.mode == DECODE)
    return base, out, state


def _q_segments(stream: Stream, ctx: StepContext) -> jax.Array:
    # Cached modes: every live query reads segment 1 (the row's own tokens).
    if ctx.mode == SEQUENCE:
        return stream.segment_ids
    return jnp.ones(stream.positions.shape, jnp.int32)


def init_state(cfg: ModelConfig, n_layers: int, batch: int, max_len: int, dtype):
    """(k, v) [layers, B, K, S, H] zeros."""
    shape = (n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def state_axes(cfg: ModelConfig):
    axes = (LAYERS, BATCH, KV_HEADS, LENGTH, HEAD_DIM)
    return axes, axes


KIND = LayerKind(
    name="attention",
    params_key="layers",
    param_shapes=param_shapes,
    init_for=default_init,
    init_state=init_state,
    state_axes=state_axes,
    step=step,
)
