"""The attention layer kind: one step for every mode (see kind.py).

Orthros: K/V come from the base stream only; the base queries attend a window of w keys, the
output stream's queries attend every key at an original position <= their own. Both streams
share every projection, norm and the FFN; each has its own query scale-offset
q = alpha * (x W_Q) + beta ([N, H], applied before RoPE). transformer: one stream, causal over
every key; swa: one stream, the window. The cache state is the head-major K/V of every layer,
k, v [layers, B, K, S, H], written in place at the layer index (no stack slicing).

Per-layer parameters (the stack adds a leading layers axis): the shared block
(kind.block_params) and wq [D, N, H], wk/wv [D, K, H], wo [N, H, D];
q_norm/k_norm [H] (qk_norm); wq_gate [D, N, H] (attn_output_gate);
so_{base,out}_{scale,offset} [N, H] (orthros with scale_offset); so_draft_{scale,offset} [N, H]
(draft_scale_offset: the output copy's SO in a speculative draft step, StepContext.draft_window).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from orthros_jax.axes import BATCH, EMBED, HEAD_DIM, HEADS, KV_HEADS, LAYERS, LENGTH
from orthros_jax.config import ModelConfig
from orthros_jax.config import kinds as kind_names
from orthros_jax.layers import primitives as nnl
from orthros_jax.layers.attend import Keys
from orthros_jax.layers.attention_impls import attend
from orthros_jax.layers.ffn import finish_layer
from orthros_jax.layers.kind import (
    CHUNK,
    DECODE,
    READ,
    SEQUENCE,
    Export,
    Kind,
    KindState,
    LayerIndex,
    ParamDecl,
    Params,
    StepContext,
    StepOut,
    Stream,
    Work,
    block_params,
    gain,
    matrix,
    norm,
    residual_std,
    scale_offsets,
)


def params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """Every per-layer parameter (without the leading layers axis): projections normal(init_std)
    (wo depth-scaled) and decayed; q/k norms and the scale-offsets not decayed."""
    d, n, k, h, std = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.init_std
    decls: dict[str, ParamDecl] = block_params(cfg)
    decls.update(
        wq=matrix((d, n, h), (EMBED, HEADS, HEAD_DIM), std, adapter_in=1),
        wk=matrix((d, k, h), (EMBED, KV_HEADS, HEAD_DIM), std, adapter_in=1),
        wv=matrix((d, k, h), (EMBED, KV_HEADS, HEAD_DIM), std, adapter_in=1),
        wo=matrix((n, h, d), (HEADS, HEAD_DIM, EMBED), residual_std(cfg), adapter_in=2),
    )
    if cfg.attn_output_gate:
        decls["wq_gate"] = matrix((d, n, h), (EMBED, HEADS, HEAD_DIM), std)
    if cfg.qk_norm:
        decls["q_norm"] = gain((h,), (HEAD_DIM,), cfg)
        decls["k_norm"] = gain((h,), (HEAD_DIM,), cfg)
    if cfg.two_streams and cfg.scale_offset:
        for stream in ("base", "out"):
            names = (f"so_{stream}_scale", f"so_{stream}_offset")
            decls.update(scale_offsets(names, (n, h), (HEADS, HEAD_DIM)))
    if cfg.two_streams and cfg.scale_offset and cfg.draft_scale_offset:
        # Filled from the output stream's SO: the untrained draft is today's windowed draft.
        names = ("so_draft_scale", "so_draft_offset")
        fill = ("so_out_scale", "so_out_offset")
        decls.update(scale_offsets(names, (n, h), (HEADS, HEAD_DIM), fill))
    return decls


def layer_kv(
    p: Params, x: jax.Array, positions: jax.Array, cfg: ModelConfig
) -> tuple[jax.Array, jax.Array]:
    """K/V of a layer from its base input x [B, L, D]: k (rotated), v [B, L, K, H]."""
    h = norm(p, x, "attn_norm", cfg)
    k = jnp.einsum("bld,dkh->blkh", h, p["wk"].astype(h.dtype))
    v = jnp.einsum("bld,dkh->blkh", h, p["wv"].astype(h.dtype))
    if cfg.qk_norm:
        k = nnl.rms_norm(k, p["k_norm"], cfg.norm_eps, cfg.norm_zero_centered)
    return nnl.apply_rope(k, positions, nnl.rope_inv_freq(cfg)), v


def layer_query(
    p: Params, x: jax.Array, positions: jax.Array, cfg: ModelConfig, stream: str
) -> jax.Array:
    """Queries [B, L, N, H] of a stream ('base', 'out' or 'draft': the output copy of a
    speculative draft with draft scale-offsets): q = alpha*(x Wq)+beta, then RoPE."""
    h = norm(p, x, "attn_norm", cfg)
    q = jnp.einsum("bld,dnh->blnh", h, p["wq"].astype(h.dtype))
    if cfg.qk_norm:
        q = nnl.rms_norm(q, p["q_norm"], cfg.norm_eps, cfg.norm_zero_centered)
    if cfg.two_streams and cfg.scale_offset:
        q = q * p[f"so_{stream}_scale"].astype(q.dtype) + p[f"so_{stream}_offset"].astype(q.dtype)
    return nnl.apply_rope(q, positions, nnl.rope_inv_freq(cfg))


def layer_finish(p: Params, x: jax.Array, attn: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Output gate (if any), shared W_O + residual (the FFN follows: ffn.finish_layer).
    attn [B, L, N, H]."""
    if cfg.attn_output_gate:
        h = norm(p, x, "attn_norm", cfg)
        gate = jnp.einsum("bld,dnh->blnh", h, p["wq_gate"].astype(h.dtype))
        attn = attn * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(attn.dtype)
    return x + jnp.einsum("blnh,nhd->bld", attn, p["wo"].astype(attn.dtype))


def step(
    p: Params,
    cfg: ModelConfig,
    base: Stream | None,
    out: Stream | None,
    state: KindState,
    li: LayerIndex,
    ctx: StepContext,
    compute_base: bool = True,
) -> StepOut:
    """One attention layer for both streams in any mode. Returns (base, out, state)."""
    kv = None
    if base is not None and ctx.mode != READ:
        kv = layer_kv(p, base.x, base.positions, cfg)
    if ctx.mode == SEQUENCE:
        assert base is not None and kv is not None
        local = full = Keys(
            kv[0],
            kv[1],
            base.positions,
            base.segment_ids,
            aligned=True,
            default_positions=ctx.default_positions,
        )
    else:  # the cache view says where K/V go and which keys are visible
        view = ctx.view
        assert view is not None, "a cached mode's context carries its cache view"
        ck, cv = state
        if ctx.mode in (CHUNK, DECODE):
            assert kv is not None
            ck, cv = view.write(ck, li, kv[0]), view.write(cv, li, kv[1])
        state = (ck, cv)
        local, full = view.keys(ck, cv, li, ctx.mode, base, kv)
    impl = cfg.attention_impl if ctx.impl is None else ctx.impl
    window = cfg.base_window
    base_attn = None
    if base is not None and compute_base:
        q = layer_query(p, base.x, base.positions, cfg, "base")
        keys = full if window is None else local
        base_attn = attend(impl, q, base.positions, _q_segments(base, ctx), keys, window, cfg)
    out_attn = None
    if out is not None:
        draft = ctx.draft_window is not None
        so = "draft" if draft and cfg.draft_scale_offset else "out"
        q_out = layer_query(p, out.x, out.positions, cfg, so)
        if ctx.out_index is not None:  # SFT copies are not the keys' own queries
            full = full.replace(aligned=False, default_positions=False, q_index=ctx.out_index)
        # A draft in sequence mode masks to its window; cached modes' views already restrict.
        out_window = ctx.draft_window if draft and ctx.mode == SEQUENCE else None
        q_seg = _q_segments(out, ctx)
        out_attn = attend(impl, q_out, out.positions, q_seg, full, out_window, cfg)
    # W_O and the FFN are token-wise and shared (decode: both streams as one batch).
    finish = lambda x, a: layer_finish(p, x, a, cfg)
    base, out = finish_layer(p, cfg, ctx, base, out, base_attn, out_attn, finish)
    return base, out, state


def _q_segments(stream: Stream, ctx: StepContext) -> jax.Array:
    # Cached modes: every live query reads segment 1 (the row's own tokens).
    if ctx.mode == SEQUENCE:
        return stream.segment_ids
    return jnp.ones(stream.positions.shape, jnp.int32)


def init_state(
    cfg: ModelConfig, n_layers: int, batch: int, max_len: int, dtype: Any
) -> tuple[jax.Array, jax.Array]:
    """(k, v) [layers, B, K, S, H] zeros."""
    shape = (n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def state_axes(cfg: ModelConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Logical axes of (k, v): batch, kv heads and slots may be split; head_dim never."""
    axes = (LAYERS, BATCH, KV_HEADS, LENGTH, HEAD_DIM)
    return axes, axes


def tokenwise_flops(cfg: ModelConfig) -> dict[str, int]:
    """Matmul FLOPs one token spends in one attention layer's projections, by part (the FFN's
    are its FFN choice's: Work.ffn)."""
    d, n, k, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    return {"q": 2 * d * n * h, "kv": 2 * 2 * d * k * h, "o": 2 * n * h * d}


def keys_read(first: int, count: int, window: int | None) -> int:
    """Keys that queries at positions first .. first + count - 1 read: min(pos + 1, window)
    each (every earlier key with window None)."""

    def upto(t: int) -> int:  # sum over positions 0 .. t - 1
        if window is None:
            return t * (t + 1) // 2
        ramp = min(t, window)
        return ramp * (ramp + 1) // 2 + max(t - window, 0) * window

    return upto(first + count) - upto(first)


def flops(cfg: ModelConfig, work: Work) -> int:
    """Necessary FLOPs of one attention layer: K/V of every new token; q, scores, o and FFN for
    the base outputs needed (their window or causal keys) and each output copy (global keys)."""
    parts = tokenwise_flops(cfg)
    per_pair = 4 * cfg.n_heads * cfg.head_dim  # QK^T and PV per (query, key)
    rest = parts["q"] + parts["o"] + work.ffn
    first = work.context - work.base_outputs
    total = work.tokens * parts["kv"]
    base_keys = keys_read(first, work.base_outputs, cfg.base_window)
    total += work.base_outputs * rest + per_pair * base_keys
    copies_first = work.context - work.copies
    total += work.copies * rest + per_pair * keys_read(copies_first, work.copies, None)
    return total


KIND = Kind(
    name=kind_names.ATTENTION,
    params_key="layers",
    params=params,
    init_state=init_state,
    state_axes=state_axes,
    step=step,
    flops=flops,
    recurrent=False,
    # Llama / Qwen3 / Qwen3.5's full attention; modeling_orthros.py's too (with the SO).
    export=Export(
        hf="full_attention",
        remote="full_attention",
        note="fla's hybrid attention layers are not mapped",
    ),
)
