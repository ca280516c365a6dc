"""What the GLA and retention layer kinds share as kinds (the interface of layers/kind.py): the
block around layers/linear_mixer.py's mixer, one step for every mode, the stacked cache state
and its logical axes. layers/gla.py and layers/retention.py each build their KIND with `make`.

Modes (as the GDN kind's, layers/gdn.py): sequence (the chunked kernel; the state restarts at
packed-document starts, ctx.reset), chunk (a prefill chunk: state in from the cache, out to
it; ctx.valid masks padding), decode (the recurrent step on the stacked state in place;
inactive rows keep their state), read (Orthros-H's output stream after prefill: the cross
query reads the final state). A single-stream arm cannot run its last prompt token alone (the
state needs every token): reads_last_token=False. In Orthros-H (orthros_h) the output copies
compute their own cross query (with the SO [N, H] of `so_names`) and read the base state.

Cache state: linear_mixer.LinearState with every field stacked over the kind's layers:
recurrent [layers, B, N, H, E] float32, conv windows [layers, B, Kc-1, heads, dim].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from orthros_jax.axes import BATCH, HEAD_DIM, HEADS, KV_HEADS, LAYERS
from orthros_jax.config import ModelConfig
from orthros_jax.layers import linear_mixer as lm
from orthros_jax.layers.kind import (
    CHUNK,
    DECODE,
    READ,
    SEQUENCE,
    Export,
    Kind,
    ParamDecl,
    Params,
    StepContext,
    Stream,
    Work,
    block_params,
    ffn_residual,
    finish_streams,
    layer_of,
    norm,
    scale_offsets,
    with_layer,
)
from orthros_jax.options import Options

Decls = dict[str, ParamDecl]


def per_token_flops(cfg: ModelConfig, spec: lm.Spec, gate: int) -> dict[str, int]:
    """FLOPs one token spends in one layer, by part (as the GDN kind's): what carries the state
    (k / v projections and conv, the decay gate's `gate` FLOPs, the update diag(a) S + k^T v)
    and what reads it (q projection and conv, the output gate, q S, out_proj, FFN)."""
    d, n, k, h, e, kc = (
        cfg.d_model,
        spec.heads,
        spec.kv_heads,
        spec.k_dim,
        spec.v_dim,
        spec.conv_kernel,
    )
    return {
        "state": 2 * d * k * (h + e) + 2 * kc * k * (h + e) + gate + 3 * n * h * e,
        "q": 2 * d * n * h + 2 * kc * n * h,
        "read": 2 * d * n * e * spec.output_gate
        + 2 * n * h * e
        + 2 * n * e * d
        + 2 * 3 * d * cfg.d_ff,
    }


def so_names(spec: lm.Spec) -> tuple[str, str]:
    return f"{spec.prefix}_so_out_scale", f"{spec.prefix}_so_out_offset"


def make(
    name: str,
    spec_of: Callable[[ModelConfig], lm.Spec],
    decay_of: Callable[[ModelConfig], lm.DecayFn],
    mixer_params: Callable[[ModelConfig], Decls],
    options: type[Options],
    gate_flops: Callable[[ModelConfig], int],
    export: Export,
) -> Kind:
    """The layer kind `name` (parameters under f"{name}_layers", options cfg.kinds.<name>)
    of a linear-attention mixer; gate_flops: FLOPs per token of its decay gate."""

    def params(cfg: ModelConfig) -> Decls:
        decls = block_params(cfg) | mixer_params(cfg)
        if cfg.two_streams and cfg.scale_offset:
            spec = spec_of(cfg)
            decls.update(scale_offsets(so_names(spec), (spec.heads, spec.k_dim), (HEADS, HEAD_DIM)))
        return decls

    def cross_so(p: Params, cfg: ModelConfig) -> lm.CrossSO | None:
        if cfg.two_streams and cfg.scale_offset:
            scale, offset = so_names(spec_of(cfg))
            return p[scale], p[offset]
        return None

    def sequence(
        p: Params, cfg: ModelConfig, base: Stream, out: Stream | None, ctx: StepContext
    ) -> tuple[jax.Array, jax.Array | None]:
        """(y [B, T, D], cross_y [B, T_out, D] or None); SFT's output copies (ctx.out_index)
        are scattered to their base tokens and taken back, as in the GDN kind."""
        spec, decay = spec_of(cfg), decay_of(cfg)
        h = norm(p, base.x, "attn_norm", cfg)
        empty = lm.init_state(spec, h.shape[0], cfg.jnp_dtype)
        kw: dict[str, Any] = dict(state=empty, positions_BL=base.positions, reset_BL=ctx.reset)
        if out is None:
            y, _, _ = lm.mix(p, h, spec, decay, **kw)
            return y, None
        h_out = norm(p, out.x, "attn_norm", cfg).astype(h.dtype)
        idx = ctx.out_index
        if idx is not None:
            rows = jnp.arange(idx.shape[0], dtype=jnp.int32)[:, None]
            h_out = jnp.zeros_like(h).at[rows, idx].set(h_out)
        y, cross_y, _ = lm.mix(
            p, h, spec, decay, cross_h_BLD=h_out, cross_so=cross_so(p, cfg), **kw
        )
        if idx is not None:
            assert cross_y is not None
            cross_y = jnp.take_along_axis(cross_y, idx[:, :, None], axis=1)
        return y, cross_y

    def step(
        p: Params,
        cfg: ModelConfig,
        base: Stream | None,
        out: Stream | None,
        state: Any,
        li: Any,
        ctx: StepContext,
        compute_base: bool = True,
    ) -> tuple[Stream | None, Stream | None, Any]:
        """One layer for both streams in any mode. Returns (base, out, state)."""
        spec, decay = spec_of(cfg), decay_of(cfg)
        y: jax.Array | None = None
        cross_y: jax.Array | None = None
        if ctx.mode == SEQUENCE:
            assert base is not None
            y, cross_y = sequence(p, cfg, base, out, ctx)
        elif ctx.mode == READ:
            if base is not None or out is None:
                raise ValueError(f"a {name} layer cannot read a base token alone")
            h_out = norm(p, out.x, "attn_norm", cfg)
            cross_y = lm.read(
                p,
                h_out,
                spec,
                state=layer_of(state, li),
                positions_B1=out.positions,
                cross_so=cross_so(p, cfg),
            )
        elif ctx.mode == CHUNK:
            if out is not None or base is None:
                raise ValueError("prefill chunks run the base stream only")
            h = norm(p, base.x, "attn_norm", cfg)
            y, _, new = lm.mix(
                p,
                h,
                spec,
                decay,
                state=layer_of(state, li),
                positions_BL=base.positions,
                valid_BL=ctx.valid,
                reset_BL=ctx.reset,
            )
            state = with_layer(state, li, new)
        elif ctx.mode == DECODE:
            assert base is not None
            h = norm(p, base.x, "attn_norm", cfg)
            cross_h = None if out is None else norm(p, out.x, "attn_norm", cfg)
            y, cross_y, state = lm.mix(
                p,
                h,
                spec,
                decay,
                state=state,
                layer=li,
                positions_BL=base.positions,
                valid_BL=ctx.valid,
                cross_h_BLD=cross_h,
                cross_so=cross_so(p, cfg),
                decode=True,
            )
        else:
            raise ValueError(f"unknown mode {ctx.mode!r}")
        if not compute_base:
            y = None
        finish = lambda x, mixed: ffn_residual(p, x, mixed.astype(x.dtype), cfg)
        base, out = finish_streams(base, out, y, cross_y, finish, ctx.mode == DECODE)
        return base, out, state

    def init_state(
        cfg: ModelConfig, n_layers: int, batch: int, max_len: int, dtype: Any
    ) -> lm.LinearState:
        """linear_mixer.init_state stacked on a leading [layers] axis; max_len is unused."""
        one = jax.eval_shape(lambda: lm.init_state(spec_of(cfg), batch, dtype))
        return jax.tree.map(lambda a: jnp.zeros((n_layers, *a.shape), a.dtype), one)

    def state_axes(cfg: ModelConfig) -> lm.LinearState:
        """The recurrent state over batch and heads; conv windows over batch and heads."""
        conv: tuple[Any, ...] = ()
        if spec_of(cfg).conv_kernel:
            conv = tuple(
                (LAYERS, BATCH, None, heads, HEAD_DIM) for heads in (HEADS, KV_HEADS, KV_HEADS)
            )
        return lm.LinearState(recurrent=(LAYERS, BATCH, HEADS, None, None), conv=conv)

    def flops(cfg: ModelConfig, work: Work) -> int:
        """The recurrent form's FLOPs (not the chunked form's extra intra-chunk work): the
        state update of every new token, a query + read + FFN per base output and per output
        copy."""
        g = per_token_flops(cfg, spec_of(cfg), gate_flops(cfg))
        return work.tokens * g["state"] + (work.base_outputs + work.copies) * (g["q"] + g["read"])

    return Kind(
        name=name,
        params_key=f"{name}_layers",
        params=params,
        init_state=init_state,
        state_axes=state_axes,
        step=step,
        flops=flops,
        recurrent=True,
        options=options,
        export=export,
        reads_last_token=False,
    )
