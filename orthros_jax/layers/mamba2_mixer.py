"""The Mamba-2 SSD token mixer (transformers' Mamba2Mixer, its `torch_forward` path) as pure
functions over one layer's parameter dict, with an optional Orthros-H cross stream, on
kernels/linear_attention.py; its options and parameter declarations. The kind (block, modes,
config section) is layers/mamba2.py.

SSD is gated linear attention with a scalar decay per head: from the normed layer input
h [B, L, D] (Nh heads of head dim P, G groups of state dim Ns, Kc conv taps),
    z, x, b, c, dt = h Wz [Nh, P], h Wx [Nh, P], h Wb [G, Ns], h Wc [G, Ns], h Wdt [Nh]
                     (+ biases with use_bias: in_proj's)
    x, b, c = silu(causal depthwise conv (+ conv bias) of each)      (over [x, B, C] in HF)
    dt = clip(softplus(dt + dt_bias), *dt_limit);  A = -exp(a_log) [Nh];  log decay dt * A
    S_t = exp(dt_t A) S_{t-1} + b_t^T (dt_t x_t)  per head [Ns, P];  y_t = c_t S_t + D x_t
    y = Wo (RMSNorm over each group of Nh/G heads (y * silu(z)) * w_norm) (+ out_proj bias)
i.e. the kernel's q = c, k = b (both repeated from their group to its Nh/G heads, torch's
repeat_interleave), v = x * dt, g = dt * A, scale 1.

Orthros-H (orthros_h): the base stream runs the mixer and carries the state; each output copy
at base token t reads the state *after* t with its own c' (the rule of the GDN cross query,
layers/gdn_mixer.py): c' = silu(h' Wc (+ bc)) without the conv (SiLU so it matches the base c
after conv + SiLU), then the scale-offset alpha * c' + beta [G, Ns] when scale_offset. The copy
also brings its own D-skip input x' = silu(h' Wx (+ bx)) and gate z' = h' Wz (+ bz): what comes
from the state is the base's, the rest is the copy's own (the base x_t could not be rebuilt in
read mode: the conv window after t lacks the oldest of t's taps). Norm, Wo and the FFN are
shared.

Padding (valid False) moves neither the state nor the conv windows; a reset (a packed
document's first token) zeroes both before the token. One layer's state (Mamba2State): conv
windows, the last Kc-1 valid pre-conv inputs, [B, Kc-1, Nh, P] and [B, Kc-1, G, Ns] (x, b, c;
activation dtype) and the SSM state [B, Nh, Ns, P] float32 (transformers' is [B, Nh, P, Ns]).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.axes import EMBED, HEAD_DIM, HEADS, KV_HEADS
from orthros_jax.config.kinds import Mamba2Options
from orthros_jax.kernels.delta_rule import causal_conv, conv_step
from orthros_jax.kernels.linear_attention import (
    chunked_linear_attention,
    linear_attention_step,
    linear_attention_step_stacked,
)
from orthros_jax.layers.kind import Initializer, ParamDecl, matrix, vector
from orthros_jax.layers.recurrent import CrossSO, MixArgs

Params = dict[str, Any]
P = "mamba2_"  # every parameter's prefix


# ------------------------------------------------------------------ parameters


def _a_log(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """transformers' A = 1 .. Nh per layer: a_log = log A."""
    a = jnp.arange(1, shape[-1] + 1, dtype=jnp.float32)
    return jnp.broadcast_to(jnp.log(a), shape).astype(dtype)


def _dt_bias(o: Mamba2Options) -> Initializer:
    """softplus^-1(dt), dt log-uniform in [dt_min, dt_max], floored at dt_floor."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        lo, hi = math.log(o.dt_min), math.log(o.dt_max)
        dt = jnp.maximum(jnp.exp(jax.random.uniform(key, shape, jnp.float32, lo, hi)), o.dt_floor)
        return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)

    return init


def mixer_params(o: Mamba2Options, d: int, std: float, out_std: float) -> dict[str, ParamDecl]:
    """Every per-layer mixer parameter (no layers axis, no SO), as transformers' Mamba2
    initialises them: projections ~ N(0, std) and weight-decayed (out_proj ~ N(0, out_std),
    depth-scaled like every kind's); conv taps ~ N(0, std), biases 0, A = 1..Nh, D = 1, the
    gated norm 1 (a plain scale), dt_bias (_dt_bias): none of them decayed."""
    n, e, g, s, kc = o.heads, o.head_dim, o.groups, o.state, o.conv_kernel
    heads, grouped = ((n, e), (HEADS, HEAD_DIM)), ((g, s), (KV_HEADS, HEAD_DIM))
    parts = {"z": heads, "x": heads, "b": grouped, "c": grouped, "dt": ((n,), (HEADS,))}
    zeros, ones, normal = nn.initializers.zeros, nn.initializers.ones, nn.initializers.normal
    decls: dict[str, ParamDecl] = {}
    for name, (shape, axes) in parts.items():
        decls[f"{P}w{name}"] = matrix((d, *shape), (EMBED, *axes), std)
        if o.use_bias:
            decls[f"{P}b{name}"] = vector(shape, axes, zeros)
    for name in "xbc":
        shape, axes = parts[name]
        decls[f"{P}conv_{name}"] = vector((kc, *shape), (None, *axes), normal(std))
        if o.conv_bias:
            decls[f"{P}conv_{name}_bias"] = vector(shape, axes, zeros)
    decls[f"{P}dt_bias"] = vector((n,), (HEADS,), _dt_bias(o))
    decls[f"{P}a_log"] = vector((n,), (HEADS,), _a_log)
    decls[f"{P}d"] = vector((n,), (HEADS,), ones)
    decls[f"{P}norm"] = vector(*heads, ones)
    decls[f"{P}out"] = matrix((n, e, d), (HEADS, HEAD_DIM, EMBED), out_std)
    if o.use_bias:
        decls[f"{P}out_bias"] = vector((d,), (EMBED,), zeros)
    return decls


def so_shape(o: Mamba2Options) -> tuple[tuple[int, ...], tuple[Any, ...]]:
    """The cross query's scale-offset [G, Ns] (orthros_h with scale_offset)."""
    return (o.groups, o.state), (KV_HEADS, HEAD_DIM)


# ------------------------------------------------------------------ state


class Mamba2State(flax.struct.PyTreeNode):
    """One layer's cache (or the same tree of shapes / logical axes, hence Any): the last Kc-1
    valid pre-conv inputs of x, b, c and the SSM state."""

    conv_x: Any  # [B, Kc-1, Nh, P]
    conv_b: Any  # [B, Kc-1, G, Ns]
    conv_c: Any  # [B, Kc-1, G, Ns]
    recurrent: Any  # [B, Nh, Ns, P] float32


def init_state(o: Mamba2Options, batch: int, dtype: Any) -> Mamba2State:
    """An empty (all-zero) state; dtype is the conv windows'."""
    j = o.conv_kernel - 1
    return Mamba2State(
        conv_x=jnp.zeros((batch, j, o.heads, o.head_dim), dtype),
        conv_b=jnp.zeros((batch, j, o.groups, o.state), dtype),
        conv_c=jnp.zeros((batch, j, o.groups, o.state), dtype),
        recurrent=jnp.zeros((batch, o.heads, o.state, o.head_dim), jnp.float32),
    )


# ------------------------------------------------------------------ the mixer


def _proj(p: Params, h: jax.Array, name: str) -> jax.Array:
    """h [B, L, D] @ W [D, ...] (+ its bias) in h's dtype."""
    y = jnp.tensordot(h, p[f"{P}w{name}"].astype(h.dtype), axes=1)
    bias = p.get(f"{P}b{name}")
    return y if bias is None else y + bias.astype(h.dtype)


def _repeat(x: jax.Array, o: Mamba2Options) -> jax.Array:
    """[..., G, Ns] -> [..., Nh, Ns] float32 (group g serves heads g*Nh/G .. (g+1)*Nh/G - 1)."""
    x = x.astype(jnp.float32)
    return jnp.repeat(x, o.per_group, axis=-2) if o.per_group > 1 else x


def _finish(
    p: Params, y: jax.Array, z: jax.Array, o: Mamba2Options, eps: float, dtype: Any
) -> jax.Array:
    """Gated grouped RMSNorm then out_proj: y, z [B, L, Nh, P] -> [B, L, D] in dtype (the norm
    runs in float32, as transformers' MambaRMSNormGated)."""
    g = y * jax.nn.silu(z.astype(jnp.float32))
    grouped = g.reshape(*g.shape[:-2], o.groups, o.per_group * o.head_dim)
    var = jnp.mean(jnp.square(grouped), axis=-1, keepdims=True)
    g = (grouped * jax.lax.rsqrt(var + eps)).reshape(g.shape)
    g = g * p[f"{P}norm"].astype(jnp.float32)
    out = jnp.tensordot(g.astype(dtype), p[f"{P}out"].astype(dtype), axes=2)
    bias = p.get(f"{P}out_bias")
    return out if bias is None else out + bias.astype(dtype)


def _cross(p: Params, h: jax.Array, so: CrossSO | None) -> tuple[jax.Array, ...]:
    """An output copy's own (c' [B, L, G, Ns], x' [B, L, Nh, P], z' [B, L, Nh, P]) from its
    normed hidden state h' (no conv: SiLU only; the SO on c')."""
    c = jax.nn.silu(_proj(p, h, "c").astype(jnp.float32))
    if so is not None:
        c = c * so[0].astype(jnp.float32) + so[1].astype(jnp.float32)
    return c, jax.nn.silu(_proj(p, h, "x").astype(jnp.float32)), _proj(p, h, "z")


def _dt(p: Params, h: jax.Array, o: Mamba2Options) -> jax.Array:
    """dt [B, L, Nh] float32: clip(softplus(h Wdt (+ bdt) + dt_bias), *dt_limit)."""
    dt = _proj(p, h, "dt").astype(jnp.float32) + p[f"{P}dt_bias"].astype(jnp.float32)
    return jnp.clip(jax.nn.softplus(dt), *o.dt_limit)


def mix(
    p: Params, o: Mamba2Options, eps: float, a: MixArgs, *, decode: bool = False
) -> tuple[jax.Array, jax.Array | None, Mamba2State]:
    """The mixer over a sequence (chunked kernel: PT/SFT, a prefill chunk) or, with
    decode=True, one token per row (L = 1; valid_BL [B, 1] the active rows), its inputs in a
    (recurrent.MixArgs). Any split of a
    sequence into calls with the state carried gives the one-call result. cross_h_BLD: the
    normed hidden state of each base token's output copy (Orthros-H). layer (decode only):
    `state` is the stack of every layer's ([layers, ...] fields), entry `layer` updated in
    place. Returns (y_BLD before the residual, cross_y_BLD or None, new state or stack); both
    outputs are zero at padding."""
    h_BLD, state, layer = a.h_BLD, a.state, a.layer
    valid_BL, reset_BL, cross_h_BLD, cross_so = a.valid_BL, a.reset_BL, a.cross_h_BLD, a.cross_so
    b, seq, _ = h_BLD.shape
    if decode and seq != 1:
        raise ValueError(f"decode takes one token per row: h [B, 1, D], got {h_BLD.shape}")
    if layer is not None and not decode:
        raise ValueError("a stacked state (layer=...) is updated in decode only")
    valid = jnp.ones((b, seq), bool) if valid_BL is None else valid_BL.astype(bool)
    reset = jnp.zeros((b, seq), bool) if reset_BL is None else reset_BL.astype(bool) & valid
    keep = valid[..., None]
    h = jnp.where(keep, h_BLD, 0)
    doc = jnp.cumsum(reset, axis=1)
    convs = {}
    new_conv = []
    for name, stored in zip("xbc", (state.conv_x, state.conv_b, state.conv_c), strict=True):
        hist = stored if layer is None else jax.lax.dynamic_index_in_dim(stored, layer, 0, False)
        u = _proj(p, h, name)
        w = p[f"{P}conv_{name}"]
        w = w.reshape(w.shape[0], -1)
        bias = p.get(f"{P}conv_{name}_bias")
        bias = None if bias is None else bias.reshape(-1)
        flat, flat_hist = u.reshape(b, seq, -1), hist.reshape(b, hist.shape[1], -1)
        if decode:
            y, new = conv_step(flat[:, 0], w, flat_hist, valid[:, 0], bias)
            y = y[:, None]
        else:
            y, new = causal_conv(flat, w, flat_hist, valid, doc, bias)
        convs[name] = y.reshape(u.shape)
        new = new.reshape(hist.shape).astype(stored.dtype)
        if layer is not None:
            new = jax.lax.dynamic_update_index_in_dim(stored, new, layer, 0)
        new_conv.append(new)
    dt = jnp.where(keep, _dt(p, h, o), 0.0)  # padding: no decay, no input
    g = dt * -jnp.exp(p[f"{P}a_log"].astype(jnp.float32))
    x = convs["x"].astype(jnp.float32)
    k = _repeat(convs["b"], o)
    v = x * dt[..., None]
    queries: tuple[jax.Array, ...] = (_repeat(convs["c"], o),)
    cross: tuple[jax.Array, ...] = ()
    if cross_h_BLD is not None:
        cross_h = jnp.where(keep, cross_h_BLD, 0).astype(h.dtype)
        cross = _cross(p, cross_h, cross_so)
        queries += (_repeat(cross[0], o),)
    if decode:
        args = (tuple(q[:, 0] for q in queries), k[:, 0], v[:, 0], g[:, 0], valid[:, 0])
        if layer is None:
            outs, s = linear_attention_step(*args, state.recurrent, scale=1.0)
        else:
            outs, s = linear_attention_step_stacked(*args, state.recurrent, layer, scale=1.0)
        outs = tuple(out[:, None] for out in outs)
    else:
        outs, s = chunked_linear_attention(
            queries, k, v, g, reset, state.recurrent, scale=1.0, chunk=o.chunk
        )
    d_skip = p[f"{P}d"].astype(jnp.float32)[:, None]
    z = _proj(p, h, "z")
    y = jnp.where(keep, _finish(p, outs[0] + d_skip * x, z, o, eps, h.dtype), 0)
    cross_y = None
    if cross:
        yc = outs[1] + d_skip * cross[1]
        cross_y = jnp.where(keep, _finish(p, yc, cross[2], o, eps, h.dtype), 0)
    new_state = Mamba2State(conv_x=new_conv[0], conv_b=new_conv[1], conv_c=new_conv[2], recurrent=s)
    return y, cross_y, new_state


def read(
    p: Params,
    cross_h_B1D: jax.Array,
    o: Mamba2Options,
    eps: float,
    *,
    state: Mamba2State,
    cross_so: CrossSO | None = None,
) -> jax.Array:
    """The output copies alone over a filled state (Orthros-H prefill's output stream): each
    row's copy of the token the state ends at reads it; nothing is written. Returns
    cross_y [B, 1, D]."""
    c, x, z = _cross(p, cross_h_B1D, cross_so)
    y = jnp.einsum("blnh,bnhe->blne", _repeat(c, o), state.recurrent.astype(jnp.float32))
    y = y + p[f"{P}d"].astype(jnp.float32)[:, None] * x
    return _finish(p, y, z, o, eps, cross_h_B1D.dtype)
