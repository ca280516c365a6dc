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


def _cache_keys(ck, cv, li, ctx: StepContext, base: Stream | None, kv) -> tuple[Keys, Keys]:
    """(window keys, global keys) of a cached mode. The global keys are the layer's whole
    head-major cache read in place; the window keys are a chunk's own K/V plus the W-1 slots
    before it (chunk), or the W slots ending at the query (decode/read)."""
    bsz, s = ctx.slot_segments.shape
    slot_ids = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (bsz, s))
    full = Keys(
        kvc.layer_view(ck, li), kvc.layer_view(cv, li), slot_ids, ctx.slot_segments,
        head_major=True,
    )  # fmt: skip
    win = ctx.window_slots
    in_range = (win >= 0) & (win < s)
    win_seg = jnp.where(
        in_range,
        jnp.take_along_axis(ctx.slot_segments, jnp.clip(win, 0, s - 1), 1),
        KEY_PAD_SEGMENT,
    )
    wk, wv = kvc.read(ck, li, win), kvc.read(cv, li, win)  # [B, K, W, H]
    if ctx.mode == CHUNK:
        k, v = kv
        ones = jnp.ones(base.positions.shape, jnp.int32)
        prefix = (jnp.swapaxes(wk, 1, 2), jnp.swapaxes(wv, 1, 2), win, win_seg)
        local = Keys(k, v, base.positions, ones, prefix=prefix, aligned=True)
    else:
        local = Keys(wk, wv, win, win_seg, head_major=True)
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
        out_attn = attend(ctx.impl, q_out, out.positions, _q_segments(out, ctx), full, None, cfg)
    if base_attn is not None and out_attn is not None and ctx.mode == DECODE:
        # W_O and the FFN are token-wise and shared: both streams as one [B, 2, D] batch.
        both = layer_finish(
            p, jnp.concatenate([base.x, out.x], 1), jnp.concatenate([base_attn, out_attn], 1), cfg
        )
        return base.replace(x=both[:, :1]), out.replace(x=both[:, 1:]), state
    if base_attn is not None:
        base = base.replace(x=layer_finish(p, base.x, base_attn, cfg))
    if out_attn is not None:
        out = out.replace(x=layer_finish(p, out.x, out_attn, cfg))
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
