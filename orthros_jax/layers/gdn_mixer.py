"""The gated DeltaNet (GDN) token mixer of Qwen3.5 (`transformers`' Qwen3_5GatedDeltaNet) as
pure functions over one layer's parameter dict, with an optional Orthros-H cross stream.

Base stream (every token), from the already-normed layer input h [B, L, D]:
    q, k, v = silu(causal depthwise conv(h Wq | h Wk | h Wv))     (kernel gdn_conv_kernel)
    q, k = l2norm(q, k) (eps 1e-6), q *= dk^-1/2; q/k heads repeated to the value heads
           (value head j reads key head j // (Hv / Hk), torch's repeat_interleave)
    beta = sigmoid(h Wb);  g = -exp(A_log) * softplus(h Wa + dt_bias)
    o = gated delta rule (gdn_kernels);  y = out(rmsnorm(o) * w_norm * silu(h Wz))
Cross stream (Orthros-H output copies), from its own normed hidden state h' at base token t:
    q' = silu(h' Wq) without the conv (SiLU so its distribution matches the base query after
         conv + SiLU; cross_silu=False drops it), then the optional scale-offset
         alpha * q' + beta applied *before* the L2 norm (so it steers the direction of the
         query, which the norm would otherwise undo for a pure scale), then normalised and scaled
         like the base query; it reads the base state after token t: o'_t = q'_t S_t.
    z' = h' Wz; the gated norm and out_proj are shared.

Parameters (per layer, no layers axis; HF tensor in brackets, mapped by gdn_hf.hf_to_gdn):
    gdn_wq, gdn_wk [D, Hk, dk]; gdn_wv, gdn_wz [D, Hv, dv]   [in_proj_qkv, in_proj_z]
    gdn_wb, gdn_wa [D, Hv]                                    [in_proj_b, in_proj_a]
    gdn_conv_q, gdn_conv_k [Kc, Hk, dk]; gdn_conv_v [Kc, Hv, dv]   [conv1d, no bias]
    gdn_dt_bias, gdn_a_log [Hv]; gdn_norm [dv] (scale w, not 1 + w); gdn_out [Hv, dv, D]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.axes import CONV_KERNEL, EMBED, GDN_K_HEADS, GDN_V_HEADS, HEAD_DIM
from orthros_jax.config import ModelConfig
from orthros_jax.kernels.delta_rule import (
    causal_conv,
    chunked_delta_rule,
    conv_step,
    delta_step,
    delta_step_stacked,
    l2_normalize,
)
from orthros_jax.layers.kind import ParamDecl, matrix, residual_std, vector

Params = dict[str, Any]
CrossSO = tuple[jax.Array, jax.Array]


def gdn_dims(cfg: ModelConfig) -> tuple[int, int, int, int]:
    """(Hk, Hv, dk, dv): key heads, value heads, key head dim, value head dim."""
    o = cfg.kinds.gdn
    return o.num_k_heads, o.num_v_heads, o.k_head_dim, o.v_head_dim


def init_a_log(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """A_log = log(A), A ~ U(0.01, 16) (transformers' Qwen3.5 init)."""
    return jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.01, 16.0)).astype(dtype)


def gdn_params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """Every per-layer GDN mixer parameter (without a layers axis), as transformers' Qwen3.5
    initialises it: projections and conv ~ N(0, init_std) (gdn_out depth-scaled like every
    kind's output projection), A = exp(A_log) ~ U(0.01, 16), dt_bias = 1, the norm weight 1
    (a plain scale w even when the model's norms are zero-centred). The projections are
    weight-decayed; the conv taps, dt_bias, A_log and the norm are not."""
    d, kc, std = cfg.d_model, cfg.kinds.gdn.conv_kernel, cfg.init_std
    hk, hv, dk, dv = gdn_dims(cfg)
    ones, conv = jax.nn.initializers.ones, jax.nn.initializers.normal(std)
    return {
        "gdn_wq": matrix((d, hk, dk), (EMBED, GDN_K_HEADS, HEAD_DIM), std, adapter_in=1),
        "gdn_wk": matrix((d, hk, dk), (EMBED, GDN_K_HEADS, HEAD_DIM), std, adapter_in=1),
        "gdn_wv": matrix((d, hv, dv), (EMBED, GDN_V_HEADS, HEAD_DIM), std, adapter_in=1),
        "gdn_wz": matrix((d, hv, dv), (EMBED, GDN_V_HEADS, HEAD_DIM), std, adapter_in=1),
        "gdn_wb": matrix((d, hv), (EMBED, GDN_V_HEADS), std),
        "gdn_wa": matrix((d, hv), (EMBED, GDN_V_HEADS), std),
        "gdn_conv_q": vector((kc, hk, dk), (CONV_KERNEL, GDN_K_HEADS, HEAD_DIM), conv),
        "gdn_conv_k": vector((kc, hk, dk), (CONV_KERNEL, GDN_K_HEADS, HEAD_DIM), conv),
        "gdn_conv_v": vector((kc, hv, dv), (CONV_KERNEL, GDN_V_HEADS, HEAD_DIM), conv),
        "gdn_dt_bias": vector((hv,), (GDN_V_HEADS,), ones),
        "gdn_a_log": vector((hv,), (GDN_V_HEADS,), init_a_log),
        "gdn_norm": vector((dv,), (HEAD_DIM,), ones),
        "gdn_out": matrix(
            (hv, dv, d), (GDN_V_HEADS, HEAD_DIM, EMBED), residual_std(cfg), adapter_in=2
        ),
    }


def check_params(p: Params, cfg: ModelConfig) -> None:
    """ValueError unless p holds every GDN parameter at its gdn_params shape (one layer, no
    layers axis; other entries are ignored)."""
    for name, decl in gdn_params(cfg).items():
        shape = decl.shape
        if name not in p or tuple(p[name].shape) != shape:
            got = tuple(p[name].shape) if name in p else "missing"
            raise ValueError(f"GDN parameter {name}: got {got}, expected shape {shape}")


# ------------------------------------------------------------------ state


class GDNState(flax.struct.PyTreeNode):
    """One GDN layer's cache: the last Kc-1 valid pre-conv inputs of q, k, v (activation
    dtype) and the recurrent state (float32). Fields are arrays, or the same tree holding their
    logical axes (gdn.state_axes): hence Any."""

    conv_q: Any  # [B, Kc-1, Hk, dk]
    conv_k: Any  # [B, Kc-1, Hk, dk]
    conv_v: Any  # [B, Kc-1, Hv, dv]
    recurrent: Any  # [B, Hv, dk, dv] float32


def gdn_state_shapes(cfg: ModelConfig, batch: int) -> dict[str, tuple[int, ...]]:
    """The shape of each GDNState field for a batch."""
    j = cfg.kinds.gdn.conv_kernel - 1
    hk, hv, dk, dv = gdn_dims(cfg)
    return {
        "conv_q": (batch, j, hk, dk),
        "conv_k": (batch, j, hk, dk),
        "conv_v": (batch, j, hv, dv),
        "recurrent": (batch, hv, dk, dv),
    }


def init_gdn_state(cfg: ModelConfig, batch: int, dtype: Any = None) -> GDNState:
    """An empty (all-zero) GDN state; dtype is the conv window's (default cfg.jnp_dtype)."""
    dtype = cfg.jnp_dtype if dtype is None else dtype
    shapes = gdn_state_shapes(cfg, batch)
    conv = {n: jnp.zeros(shapes[n], dtype) for n in ("conv_q", "conv_k", "conv_v")}
    return GDNState(**conv, recurrent=jnp.zeros(shapes["recurrent"], jnp.float32))


# ------------------------------------------------------------------ the mixer


def _check_inputs(
    p: Params,
    h: jax.Array,
    cfg: ModelConfig,
    state: GDNState | None,
    masks: Mapping[str, tuple[jax.Array | None, tuple[int, ...]]],
    cross_h: jax.Array | None,
    cross_so: CrossSO | None,
) -> None:
    """Shape checks that would otherwise surface as XLA shape errors (raised while tracing,
    before any compile). masks: name -> (array or None, expected shape)."""
    check_params(p, cfg)
    if h.ndim != 3 or h.shape[-1] != cfg.d_model:
        raise ValueError(f"h must be [B, L, D={cfg.d_model}], got shape {h.shape}")
    for name, (m, shape) in masks.items():
        if m is not None and tuple(m.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} to match h {h.shape}, got {m.shape}")
    if cross_h is not None and cross_h.shape != h.shape:
        raise ValueError(
            f"cross_h must match h's shape {h.shape} (one output copy per base token), "
            f"got {cross_h.shape}"
        )
    if cross_so is not None:
        if cross_h is None:
            raise ValueError("cross_so was given without cross_h (it scales the cross query)")
        want = (cfg.kinds.gdn.num_k_heads, cfg.kinds.gdn.k_head_dim)
        if len(cross_so) != 2 or any(tuple(x.shape) != want for x in cross_so):
            got = [getattr(x, "shape", x) for x in cross_so]
            raise ValueError(f"cross_so must be (scale, offset), each of shape {want}; got {got}")
    if state is not None:
        for name, shape in gdn_state_shapes(cfg, h.shape[0]).items():
            if tuple(getattr(state, name).shape) != shape:
                raise ValueError(
                    f"GDNState.{name} has shape {getattr(state, name).shape}, expected {shape} "
                    f"(batch {h.shape[0]})"
                )


def _proj(h: jax.Array, w: jax.Array) -> jax.Array:
    """h [..., D] @ w [D, ...] -> [..., ...] in h's dtype."""
    return jnp.tensordot(h, w.astype(h.dtype), axes=1)


def _to_value_heads(x: jax.Array, cfg: ModelConfig) -> jax.Array:
    """[..., Hk, dk] -> [..., Hv, dk]: value head j reads key head j // (Hv/Hk)."""
    return jnp.repeat(x, cfg.kinds.gdn.num_v_heads // cfg.kinds.gdn.num_k_heads, axis=-2)


def _query(q: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Raw query [..., Hk, dk] -> L2-normalised, scaled by dk^-1/2, value heads, float32."""
    q = l2_normalize(q.astype(jnp.float32)) * cfg.kinds.gdn.k_head_dim**-0.5
    return _to_value_heads(q, cfg)


def _cross_query(
    p: Params, cross_h: jax.Array, cfg: ModelConfig, cross_so: CrossSO | None, cross_silu: bool
) -> jax.Array:
    """The cross stream's query [..., Hv, dk] (float32): no conv, optional SiLU, optional SO
    before the L2 norm, then normalised and scaled as the base query."""
    q = _proj(cross_h, p["gdn_wq"]).astype(jnp.float32)
    if cross_silu:
        q = jax.nn.silu(q)
    if cross_so is not None:
        q = q * cross_so[0].astype(jnp.float32) + cross_so[1].astype(jnp.float32)
    return _query(q, cfg)


def _finish(p: Params, o: jax.Array, h: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Gated RMSNorm per value head with z = h Wz, then out_proj: o [..., Hv, dv] float32,
    h [..., D] -> [..., D] in h's dtype, cast where transformers' Qwen3_5RMSNormGated casts."""
    dt = h.dtype
    z = _proj(h, p["gdn_wz"]).astype(jnp.float32)
    o = o.astype(dt).astype(jnp.float32)
    var = jnp.mean(jnp.square(o), axis=-1, keepdims=True)
    normed = (o * jax.lax.rsqrt(var + cfg.norm_eps)).astype(dt) * p["gdn_norm"].astype(dt)
    gated = (normed.astype(jnp.float32) * jax.nn.silu(z)).astype(dt)
    return jnp.tensordot(gated, p["gdn_out"].astype(dt), axes=2)


ConvFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
RuleFn = Callable[..., tuple[tuple[jax.Array, ...], jax.Array]]


def _mix(
    p: Params,
    h: jax.Array,
    cross_h: jax.Array | None,
    valid: jax.Array,
    cfg: ModelConfig,
    state: GDNState,
    conv: ConvFn,
    rule: RuleFn,
    cross_so: CrossSO | None,
    cross_silu: bool,
) -> tuple[jax.Array, jax.Array | None, GDNState]:
    """The mixer around a conv (x_BLC, w_KC, hist_BJC) -> (y, hist) and a delta rule
    (queries, k, v, beta, g, S) -> (outs, S); h, cross_h [B, L, D], valid [B, L]."""
    b, seq, _ = h.shape
    dt = cfg.jnp_dtype
    keep = valid[..., None]
    h = jnp.where(keep, h, 0).astype(dt)
    # q, k and v run the depthwise conv separately (it is per channel): no concatenation
    # across differently sharded head axes.
    x, hist = {}, {}
    for key in "qkv":
        w = p[f"gdn_conv_{key}"]
        pre = _proj(h, p[f"gdn_w{key}"])  # [B, L, heads, dim]
        old = getattr(state, f"conv_{key}")  # [B, Kc-1, heads, dim]
        # conv takes and returns the stored window as stored (one layer's, or the stack)
        y, new = conv(pre.reshape(b, seq, -1), w.reshape(w.shape[0], -1), old)
        x[key], hist[key] = y.reshape(pre.shape), new
    q, k, v = x["q"], x["k"], x["v"]

    beta = jnp.where(keep, jax.nn.sigmoid(_proj(h, p["gdn_wb"]).astype(jnp.float32)), 0.0)
    a = _proj(h, p["gdn_wa"]).astype(jnp.float32) + p["gdn_dt_bias"].astype(jnp.float32)
    g = -jnp.exp(p["gdn_a_log"].astype(jnp.float32)) * jax.nn.softplus(a)
    g = jnp.where(keep, g, 0.0)  # padding: decay 1 and beta 0 leave the state unchanged

    queries: tuple[jax.Array, ...] = (_query(q, cfg),)
    if cross_h is not None:
        cross_h = jnp.where(keep, cross_h, 0).astype(dt)
        queries += (_cross_query(p, cross_h, cfg, cross_so, cross_silu),)
    k = _to_value_heads(l2_normalize(k.astype(jnp.float32)), cfg)
    outs, recurrent = rule(queries, k, v, beta, g, state.recurrent)

    y = jnp.where(keep, _finish(p, outs[0], h, cfg), 0)
    cross_y = None if cross_h is None else jnp.where(keep, _finish(p, outs[1], cross_h, cfg), 0)
    new_state = GDNState(conv_q=hist["q"], conv_k=hist["k"], conv_v=hist["v"], recurrent=recurrent)
    return y, cross_y, new_state


def gdn_mix(
    p: Params,
    h_BLD: jax.Array,
    cfg: ModelConfig,
    *,
    state: GDNState | None = None,
    valid_BL: jax.Array | None = None,
    reset_BL: jax.Array | None = None,
    cross_h_BLD: jax.Array | None = None,
    cross_so: CrossSO | None = None,
    cross_silu: bool = True,
) -> tuple[jax.Array, jax.Array | None, GDNState]:
    """The GDN mixer over a sequence (PT/SFT forward, a prefill chunk), chunked form.

    h_BLD: the already-normed layer input. state: carried from the previous call (None = empty;
    any split of a sequence into calls gives the one-call result). valid_BL (default all True):
    False = padding, which changes neither the recurrent state nor the conv window, anywhere in
    the row. reset_BL (default all False): True at the first token of a new packed document;
    state and conv history are zeroed before it (ignored on padding). cross_h_BLD: the normed
    hidden state of the output copy of each base token (Orthros-H), cross_so its optional
    (scale, offset) [Hk, dk]. Returns (y_BLD before the residual, cross_y_BLD or None, new
    state); y and cross_y are zero at padding.
    """
    b, seq = h_BLD.shape[:2]
    masks = {"valid_BL": (valid_BL, (b, seq)), "reset_BL": (reset_BL, (b, seq))}
    _check_inputs(p, h_BLD, cfg, state, masks, cross_h_BLD, cross_so)
    state = init_gdn_state(cfg, b) if state is None else state
    valid = jnp.ones((b, seq), bool) if valid_BL is None else valid_BL.astype(bool)
    reset = jnp.zeros((b, seq), bool) if reset_BL is None else reset_BL.astype(bool)
    reset = reset & valid
    doc = jnp.cumsum(reset, axis=1)

    def conv(x: jax.Array, w: jax.Array, stored: jax.Array) -> tuple[jax.Array, jax.Array]:
        y, hist = causal_conv(x, w, stored.reshape(b, stored.shape[1], -1), valid, doc)
        return y, hist.reshape(stored.shape)

    def rule(
        queries: tuple[jax.Array, ...],
        k: jax.Array,
        v: jax.Array,
        beta: jax.Array,
        g: jax.Array,
        s: jax.Array,
    ) -> tuple[tuple[jax.Array, ...], jax.Array]:
        return chunked_delta_rule(queries, k, v, beta, g, reset, s, cfg.kinds.gdn.chunk)

    return _mix(p, h_BLD, cross_h_BLD, valid, cfg, state, conv, rule, cross_so, cross_silu)


def gdn_decode(
    p: Params,
    h_B1D: jax.Array,
    cfg: ModelConfig,
    *,
    state: GDNState,
    active_B: jax.Array,
    cross_h_B1D: jax.Array | None = None,
    cross_so: CrossSO | None = None,
    cross_silu: bool = True,
    layer: jax.Array | int | None = None,
) -> tuple[jax.Array, jax.Array | None, GDNState]:
    """One decode token per row, recurrent form (no chunk padding): the same outputs as
    gdn_mix on a length-1 call. active_B False = the row keeps its state and outputs zeros.
    layer: `state` is the stack of every GDN layer's state ([layers, ...] fields) and entry
    `layer` is updated in place (delta_step_stacked). Returns (y_B1D, cross_y_B1D or None, new
    state, or the stack)."""
    b = h_B1D.shape[0]
    if h_B1D.ndim != 3 or h_B1D.shape[1] != 1:
        raise ValueError(f"gdn_decode takes one token per row: h [B, 1, D], got {h_B1D.shape}")
    masks = {"active_B": (active_B, (b,))}
    one = (
        state
        if layer is None
        else jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), state)
    )
    _check_inputs(p, h_B1D, cfg, one, masks, cross_h_B1D, cross_so)
    active = active_B.astype(bool)
    # a gather, not a dynamic slice: see delta_step_stacked
    at = lambda a: a if layer is None else jnp.take(a, layer, axis=0, mode="clip")

    def conv(x: jax.Array, w: jax.Array, stored: jax.Array) -> tuple[jax.Array, jax.Array]:
        one = at(stored)
        y, hist = conv_step(x[:, 0], w, one.reshape(b, one.shape[1], -1), active)
        hist = hist.reshape(one.shape).astype(stored.dtype)
        if layer is not None:
            hist = jax.lax.dynamic_update_index_in_dim(stored, hist, layer, 0)
        return y[:, None], hist

    def rule(
        queries: tuple[jax.Array, ...],
        k: jax.Array,
        v: jax.Array,
        beta: jax.Array,
        g: jax.Array,
        s: jax.Array,
    ) -> tuple[tuple[jax.Array, ...], jax.Array]:
        args = (tuple(q[:, 0] for q in queries), k[:, 0], v[:, 0], beta[:, 0], g[:, 0], active)
        outs, s = delta_step(*args, s) if layer is None else delta_step_stacked(*args, s, layer)
        return tuple(o[:, None] for o in outs), s

    return _mix(
        p, h_B1D, cross_h_B1D, active[:, None], cfg, state, conv, rule, cross_so, cross_silu
    )


def gdn_read(
    p: Params,
    cross_h_B1D: jax.Array,
    cfg: ModelConfig,
    *,
    state: GDNState,
    cross_so: CrossSO | None = None,
    cross_silu: bool = True,
) -> jax.Array:
    """The cross stream alone over a filled state (Orthros-H prefill's output stream): each
    row's output copy of the token the state ends at reads it, o' = q' S, nothing is written.
    Equals gdn_mix's cross output at that token. Returns cross_y [B, 1, D]."""
    if cross_h_B1D.ndim != 3 or cross_h_B1D.shape[1] != 1:
        raise ValueError(f"gdn_read takes one token per row: [B, 1, D], got {cross_h_B1D.shape}")
    _check_inputs(p, cross_h_B1D, cfg, state, {}, cross_h_B1D, cross_so)
    h = cross_h_B1D.astype(cfg.jnp_dtype)
    q = _cross_query(p, h, cfg, cross_so, cross_silu)  # [B, 1, Hv, dk]
    o = jnp.einsum("blhk,bhkv->blhv", q, state.recurrent.astype(jnp.float32))
    return _finish(p, o, h, cfg)
