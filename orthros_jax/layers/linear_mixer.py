"""The token mixer that fla's GatedLinearAttention (kind "gla") and MultiScaleRetention (kind
"retention") share, as pure functions over one layer's parameter dict, with an optional
Orthros-H cross stream. Each kind module supplies its `Spec` (names, dims, options) and its
decay; the kernel is kernels/linear_attention.py.

Base stream, from the already-normed layer input h [B, L, D] (N heads, K kv heads, H key and
E value head dims, Kc conv taps):
    q, k, v = h Wq [N, H], h Wk [K, H], h Wv [K, E]  (no bias), each through a causal depthwise
              conv + SiLU when the spec has one (GLA's use_short_conv)
    q, k = feature_map(q), feature_map(k);  RetNet: rotary on both at the tokens' positions
    k, v (and a per-kv-head decay) repeated to the N heads (kv head j serves heads jG..jG+G-1)
    o = gated linear attention (scale H^-1/2), state S [N, H, E] in float32
    y = Wo (RMSNorm over E (weight [E] when norm_affine) * swish(h Wg) (when output_gate))
Cross stream (Orthros-H output copies), from its own normed hidden state h' at base token t:
    q' = h' Wq (SiLU'd when the base query has a conv, so it matches the base query after conv
    + SiLU), then the optional scale-offset alpha * q' + beta [N, H], the feature map and the
    rotary of the token's position; it reads the base state after token t. Gate, norm and Wo
    are shared (the gate from h').
Padding (valid False) moves neither the state nor the conv windows; a reset (a packed
document's first token) zeroes both before the token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.axes import EMBED, HEAD_DIM, HEADS, KV_HEADS
from orthros_jax.config import ModelConfig
from orthros_jax.kernels.delta_rule import causal_conv, conv_step
from orthros_jax.kernels.linear_attention import (
    chunked_linear_attention,
    linear_attention_step,
    linear_attention_step_stacked,
)
from orthros_jax.layers.kind import ParamDecl, matrix, residual_std, vector
from orthros_jax.layers.recurrent import CrossSO, MixArgs

Params = dict[str, Any]
FEATURE_MAP: dict[str | None, Callable[[jax.Array], jax.Array]] = {
    None: lambda x: x,
    "relu": jax.nn.relu,
    "sigmoid": jax.nn.sigmoid,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}
# (p, h_BLD float32-able) -> log decay [B, L, K, H] (per key dim) or [N] (fixed per head)
DecayFn = Callable[[Params, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class Spec:
    """One kind's mixer: its parameter prefix, dims and fla options."""

    prefix: str  # parameter names: {prefix}_wq, ...
    heads: int
    kv_heads: int
    k_dim: int
    v_dim: int
    feature_map: str | None
    output_gate: bool
    norm_affine: bool
    chunk: int
    conv_kernel: int = 0  # 0: no short conv
    rotary: bool = False  # RetNet: rotate-half over the whole key head dim, base 10000
    norm_eps: float = 1e-6

    @property
    def groups(self) -> int:
        return self.heads // self.kv_heads


def params(spec: Spec, cfg: ModelConfig) -> dict[str, ParamDecl]:
    """The mixer parameters every spec has (without a layers axis), as fla initialises them:
    projections and conv ~ N(0, init_std) ({prefix}_out depth-scaled like every kind's output
    projection), the norm 1. The projections are weight-decayed; the conv taps and the norm
    are not."""
    n, k, h, e, pre, d = spec.heads, spec.kv_heads, spec.k_dim, spec.v_dim, spec.prefix, cfg.d_model
    std = cfg.init_std
    decls: dict[str, ParamDecl] = {
        f"{pre}_wq": matrix((d, n, h), (EMBED, HEADS, HEAD_DIM), std, adapter_in=1),
        f"{pre}_wk": matrix((d, k, h), (EMBED, KV_HEADS, HEAD_DIM), std, adapter_in=1),
        f"{pre}_wv": matrix((d, k, e), (EMBED, KV_HEADS, HEAD_DIM), std, adapter_in=1),
        f"{pre}_out": matrix((n, e, d), (HEADS, HEAD_DIM, EMBED), residual_std(cfg), adapter_in=2),
    }
    if spec.output_gate:
        decls[f"{pre}_wg"] = matrix((d, n, e), (EMBED, HEADS, HEAD_DIM), std)
    if spec.norm_affine:
        decls[f"{pre}_norm"] = vector((e,), (HEAD_DIM,), jax.nn.initializers.ones)
    if spec.conv_kernel:
        kc, conv = spec.conv_kernel, jax.nn.initializers.normal(std)
        decls[f"{pre}_conv_q"] = vector((kc, n, h), (None, HEADS, HEAD_DIM), conv)
        decls[f"{pre}_conv_k"] = vector((kc, k, h), (None, KV_HEADS, HEAD_DIM), conv)
        decls[f"{pre}_conv_v"] = vector((kc, k, e), (None, KV_HEADS, HEAD_DIM), conv)
    return decls


@flax.struct.dataclass
class LinearState:
    """One layer's cache: the recurrent state (float32) and, with a short conv, the last Kc-1
    valid pre-conv inputs of q, k, v (activation dtype; an empty tuple without a conv)."""

    # Arrays, or the same tree of their shapes / logical axes (state_shapes, state_axes): Any.
    recurrent: Any  # [B, N, H, E] float32
    conv: tuple[Any, ...] = ()  # ([B, Kc-1, N, H], [B, Kc-1, K, H], [B, Kc-1, K, E])


def state_shapes(spec: Spec, batch: int) -> LinearState:
    """The shape of each LinearState field for a batch (as a LinearState of tuples)."""
    conv: tuple[Any, ...] = ()
    if spec.conv_kernel:
        j = spec.conv_kernel - 1
        conv = (
            (batch, j, spec.heads, spec.k_dim),
            (batch, j, spec.kv_heads, spec.k_dim),
            (batch, j, spec.kv_heads, spec.v_dim),
        )
    return LinearState(recurrent=(batch, spec.heads, spec.k_dim, spec.v_dim), conv=conv)


def init_state(spec: Spec, batch: int, dtype: Any) -> LinearState:
    """An empty (all-zero) state; dtype is the conv windows'."""
    shapes = state_shapes(spec, batch)
    return LinearState(
        recurrent=jnp.zeros(shapes.recurrent, jnp.float32),
        conv=tuple(jnp.zeros(s, dtype) for s in shapes.conv),
    )


def _proj(h: jax.Array, w: jax.Array) -> jax.Array:
    """h [..., D] @ w [D, ...] in h's dtype."""
    return jnp.tensordot(h, w.astype(h.dtype), axes=1)


def _rotary(x_BLNH: jax.Array, positions_BL: jax.Array) -> jax.Array:
    """fla's RotaryEmbedding(dim=H): rotate-half over all H dims, inv_freq 10000^(-2i/H)."""
    from orthros_jax.layers.primitives import apply_rope

    h = x_BLNH.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    return apply_rope(x_BLNH, positions_BL, inv)


def _repeat(x: jax.Array, spec: Spec) -> jax.Array:
    """[..., K, d] -> [..., N, d] (kv head j serves heads j*G .. j*G + G-1)."""
    return jnp.repeat(x, spec.groups, axis=-2) if spec.groups > 1 else x


def _query(q: jax.Array, spec: Spec, positions: jax.Array) -> jax.Array:
    q = FEATURE_MAP[spec.feature_map](q.astype(jnp.float32))
    return _rotary(q, positions) if spec.rotary else q


def _finish(p: Params, o: jax.Array, h: jax.Array, spec: Spec) -> jax.Array:
    """Wo (RMSNorm_E(o) [* w] [* swish(h Wg)]): o [B, L, N, E] float32, h [B, L, D] -> [B, L, D]
    in h's dtype (fla's fused norm-gate runs in float32)."""
    pre = spec.prefix
    var = jnp.mean(jnp.square(o), axis=-1, keepdims=True)
    o = o * jax.lax.rsqrt(var + spec.norm_eps)
    if spec.norm_affine:
        o = o * p[f"{pre}_norm"].astype(jnp.float32)
    if spec.output_gate:
        o = o * jax.nn.silu(_proj(h, p[f"{pre}_wg"]).astype(jnp.float32))
    return jnp.tensordot(o.astype(h.dtype), p[f"{pre}_out"].astype(h.dtype), axes=2)


def cross_query(
    p: Params, cross_h: jax.Array, spec: Spec, positions: jax.Array, cross_so: CrossSO | None
) -> jax.Array:
    """The cross stream's query [B, L, N, H] (float32) from its normed hidden state."""
    q = _proj(cross_h, p[f"{spec.prefix}_wq"]).astype(jnp.float32)
    if spec.conv_kernel:
        q = jax.nn.silu(q)
    if cross_so is not None:
        q = q * cross_so[0].astype(jnp.float32) + cross_so[1].astype(jnp.float32)
    return _query(q, spec, positions)


def mix(
    p: Params, spec: Spec, decay: DecayFn, a: MixArgs, *, decode: bool = False
) -> tuple[jax.Array, jax.Array | None, LinearState]:
    """The mixer over a sequence (chunked kernel; PT/SFT, a prefill chunk) or, with decode=True,
    one token per row (recurrent step; L = 1, a.valid_BL [B, 1] = the active rows), its inputs
    in a (recurrent.MixArgs). Any split of a sequence into calls with the state carried gives
    the one-call result. cross_h_BLD: the normed hidden state of each base token's output copy
    (Orthros-H), same shape as h. layer (decode only): `state` is the stack of every layer's
    state ([layers, ...] fields) and entry `layer` is updated in place (kernels'
    linear_attention_step_stacked). Returns (y_BLD before the residual, cross_y_BLD or None,
    new state, or the stack); y and cross_y are zero at padding."""
    h_BLD, state, layer, positions_BL = a.h_BLD, a.state, a.layer, a.positions_BL
    valid_BL, reset_BL, cross_h_BLD, cross_so = a.valid_BL, a.reset_BL, a.cross_h_BLD, a.cross_so
    b, seq, _ = h_BLD.shape
    if decode and seq != 1:
        raise ValueError(f"decode takes one token per row: h [B, 1, D], got {h_BLD.shape}")
    if layer is not None and not decode:
        raise ValueError("a stacked state (layer=...) is updated in decode only")
    at = lambda a: a if layer is None else jax.lax.dynamic_index_in_dim(a, layer, keepdims=False)
    valid = jnp.ones((b, seq), bool) if valid_BL is None else valid_BL.astype(bool)
    reset = jnp.zeros((b, seq), bool) if reset_BL is None else reset_BL.astype(bool) & valid
    keep = valid[..., None]
    h = jnp.where(keep, h_BLD, 0)
    pre = spec.prefix
    x = {n: _proj(h, p[f"{pre}_w{n}"]) for n in "qkv"}  # [B, L, heads, dim]
    conv = state.conv
    if spec.conv_kernel:
        doc = jnp.cumsum(reset, axis=1)
        new_conv = []
        for n, stored in zip("qkv", state.conv, strict=True):
            hist = at(stored)
            w = p[f"{pre}_conv_{n}"]
            w, flat = w.reshape(w.shape[0], -1), x[n].reshape(b, seq, -1)
            flat_hist = hist.reshape(b, hist.shape[1], -1)
            if decode:
                y, new = conv_step(flat[:, 0], w, flat_hist, valid[:, 0])
                y = y[:, None]
            else:
                y, new = causal_conv(flat, w, flat_hist, valid, doc)
            x[n] = y.reshape(x[n].shape)
            new = new.reshape(hist.shape).astype(stored.dtype)
            if layer is not None:
                new = jax.lax.dynamic_update_index_in_dim(stored, new, layer, 0)
            new_conv.append(new)
        conv = tuple(new_conv)

    g = decay(p, h)
    if g.ndim == 1:  # fixed per-head decay [N]
        g = jnp.broadcast_to(g, (b, seq, spec.heads))
    else:
        g = _repeat(g, spec)
    g = jnp.where(keep if g.ndim == 3 else keep[..., None], g, 0.0)
    q = _query(x["q"], spec, positions_BL)
    k = _repeat(_query(x["k"], spec, positions_BL), spec)
    k = jnp.where(keep[..., None], k, 0.0)  # padding adds nothing to the state
    v = _repeat(x["v"].astype(jnp.float32), spec)
    queries: tuple[jax.Array, ...] = (q,)
    if cross_h_BLD is not None:
        cross_h = jnp.where(keep, cross_h_BLD, 0).astype(h.dtype)
        queries += (cross_query(p, cross_h, spec, positions_BL, cross_so),)
    scale = spec.k_dim**-0.5
    if decode:
        step_args = (tuple(q[:, 0] for q in queries), k[:, 0], v[:, 0], g[:, 0], valid[:, 0])
        if layer is None:
            outs, s = linear_attention_step(*step_args, state.recurrent, scale=scale)
        else:
            outs, s = linear_attention_step_stacked(*step_args, state.recurrent, layer, scale=scale)
        outs = tuple(o[:, None] for o in outs)
    else:
        outs, s = chunked_linear_attention(
            queries, k, v, g, reset, state.recurrent, scale=scale, chunk=spec.chunk
        )
    y = jnp.where(keep, _finish(p, outs[0], h, spec), 0)
    cross_y = None
    if cross_h_BLD is not None:
        cross_y = jnp.where(keep, _finish(p, outs[1], cross_h, spec), 0)
    return y, cross_y, LinearState(recurrent=s, conv=conv)


def read(
    p: Params,
    cross_h_B1D: jax.Array,
    spec: Spec,
    *,
    state: LinearState,
    positions_B1: jax.Array,
    cross_so: CrossSO | None = None,
) -> jax.Array:
    """The cross stream alone over a filled state (Orthros-H prefill's output stream): each
    row's output copy of the token the state ends at reads it; nothing is written. Returns
    cross_y [B, 1, D]."""
    q = cross_query(p, cross_h_B1D, spec, positions_B1, cross_so)
    o = jnp.einsum("blnh,bnhe->blne", q * spec.k_dim**-0.5, state.recurrent.astype(jnp.float32))
    return _finish(p, o, cross_h_B1D, spec)
