"""Float64 NumPy oracles of gated linear attention, token by token from the equations, importing
nothing from `orthros_jax`: the recurrence itself (for the kernel tests) and fla's GLA and
RetNet token mixers over one row (for the layer tests).

Where each fact comes from (flash-linear-attention 0.6.0, read from its source):
  The recurrence (fla/ops/gla/naive.py, simple_gla/naive.py): per head, state S [H, E],
    S_t = diag(exp g_t) S_{t-1} + k_t^T v_t,   o_t = (q_t * scale) S_t,   scale = H^-1/2,
    g_t [H] for GLA, one value per head for RetNet; a new document starts from S = 0.
  GLA (fla/layers/gla.py): q = x Wq [N, H], k = x Wk [K, H], v = x Wv [K, E] (no bias), each
    through an optional causal depthwise conv + SiLU (use_short_conv); gk = x W1 W2 + b2
    ([K, H], low rank, from the un-convolved input), gk = logsigmoid(gk) / normalizer, then
    max(gk, clamp_min) when set; optional feature map on q and k; k, v, gk heads repeated
    (kv head j serves query heads j*G .. j*G+G-1, repeat_interleave); o per head through
    RMSNorm over E (weight [E] when elementwise_affine) times swish(x Wg) when the output gate
    is on; out = o Wo.
  RetNet (fla/layers/multiscale_retention.py): the same projections and norm/gate, no conv;
    rotary over all H dims (rotate-half, inv_freq = 10000^(-2i/H), position = the token's
    index in the row) on q and k after the feature map; decay per head gamma_n = 1 - 2^(-5-n).
Shapes: L tokens, D d_model, N heads, K kv heads, H key head dim, E value head dim, Kc conv.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Params = dict[str, Any]

FEATURE_MAPS = {
    None: lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "swish": lambda x: x / (1.0 + np.exp(-x)),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def logsigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def recurrence(
    q_LNH: np.ndarray,
    k_LNH: np.ndarray,
    v_LNE: np.ndarray,
    g: np.ndarray,
    reset_L: np.ndarray,
    s_NHE: np.ndarray,
    scale: float,
    states: list | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One row of the recurrence in float64; g [L, N, H] or [L, N]. Returns (o [L, N, E],
    final state [N, H, E]); `states`, when given, gets the state after each token."""
    q, k, v, g = (np.asarray(x, np.float64) for x in (q_LNH, k_LNH, v_LNE, g))
    s = np.array(s_NHE, np.float64)
    o = np.zeros(v.shape, np.float64)
    for t in range(q.shape[0]):
        if reset_L[t]:
            s = np.zeros_like(s)
        decay = np.exp(g[t])[..., None] if g.ndim == 3 else np.exp(g[t])[:, None, None]
        s = decay * s + k[t][:, :, None] * v[t][:, None, :]
        o[t] = np.einsum("nh,nhe->ne", q[t] * scale, s)
        if states is not None:
            states.append(s)
    return o, s


def conv_silu(x_LC: np.ndarray, w_KcC: np.ndarray) -> np.ndarray:
    """Causal depthwise conv (tap Kc-1 is the token itself; zeros before the row) + SiLU."""
    kc = w_KcC.shape[0]
    padded = np.concatenate([np.zeros((kc - 1, x_LC.shape[1])), x_LC])
    out = sum(padded[i : i + len(x_LC)] * w_KcC[i] for i in range(kc))
    return silu(out)


def rotary(x_LNH: np.ndarray, positions_L: np.ndarray) -> np.ndarray:
    """Rotate-half rotary over all H dims, inv_freq = 10000^(-2i/H)."""
    h = x_LNH.shape[-1]
    inv = 1.0 / 10000.0 ** (np.arange(0, h, 2) / h)
    ang = positions_L[:, None] * inv[None]  # [L, H/2]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x1, x2 = x_LNH[..., : h // 2], x_LNH[..., h // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _norm_gate(p: Params, o_LNE: np.ndarray, x_LD: np.ndarray, prefix: str, eps: float):
    """RMSNorm over E (weight when present) times swish(x Wg) (when present); then Wo."""
    o = o_LNE / np.sqrt(np.mean(o_LNE**2, axis=-1, keepdims=True) + eps)
    if f"{prefix}_norm" in p:
        o = o * p[f"{prefix}_norm"]
    if f"{prefix}_wg" in p:
        o = o * silu(np.einsum("ld,dne->lne", x_LD, p[f"{prefix}_wg"]))
    return np.einsum("lne,ned->ld", o, p[f"{prefix}_out"])


def gla_mixer(
    p: Params,
    x_LD: np.ndarray,
    eps: float,
    *,
    feature_map: str | None = None,
    normalizer: float = 16.0,
    clamp_min: float | None = None,
) -> np.ndarray:
    """fla's GatedLinearAttention over one row from the (normed) input x [L, D] -> [L, D].
    Params (float64-able): gla_wq [D, N, H], gla_wk [D, K, H], gla_wv [D, K, E], gla_wgk1
    [D, R], gla_wgk2 [R, K, H], gla_bgk [K, H], gla_out [N, E, D]; optional gla_wg [D, N, E],
    gla_norm [E], gla_conv_q/k/v [Kc, heads, dim]."""
    p = {n: np.asarray(a, np.float64) for n, a in p.items()}
    x = np.asarray(x_LD, np.float64)
    proj = {n: np.einsum("ld,dhk->lhk", x, p[f"gla_w{n}"]) for n in "qkv"}
    if "gla_conv_q" in p:
        for n, y in proj.items():
            w = p[f"gla_conv_{n}"]
            proj[n] = conv_silu(y.reshape(len(x), -1), w.reshape(w.shape[0], -1)).reshape(y.shape)
    gk = np.einsum("lr,rkh->lkh", x @ p["gla_wgk1"], p["gla_wgk2"]) + p["gla_bgk"]
    gk = logsigmoid(gk) / normalizer
    if clamp_min is not None:
        gk = np.maximum(gk, clamp_min)
    fm = FEATURE_MAPS[feature_map]
    q, k = fm(proj["q"]), fm(proj["k"])
    groups = q.shape[1] // k.shape[1]
    k, v, gk = (np.repeat(a, groups, axis=1) for a in (k, proj["v"], gk))
    hk, nh, e = q.shape[-1], q.shape[1], v.shape[-1]
    o, _ = recurrence(q, k, v, gk, np.zeros(len(x), bool), np.zeros((nh, hk, e)), hk**-0.5)
    return _norm_gate(p, o, x, "gla", eps)


def retention_mixer(
    p: Params, x_LD: np.ndarray, eps: float, *, feature_map: str | None = None, offset: int = 0
) -> np.ndarray:
    """fla's MultiScaleRetention over one row from the (normed) input x [L, D] -> [L, D];
    positions start at `offset`. Params: retention_wq [D, N, H], retention_wk [D, K, H],
    retention_wv [D, K, E], retention_out [N, E, D]; optional retention_wg [D, N, E], retention_norm
    [E]."""
    p = {n: np.asarray(a, np.float64) for n, a in p.items()}
    x = np.asarray(x_LD, np.float64)
    proj = {n: np.einsum("ld,dhk->lhk", x, p[f"retention_w{n}"]) for n in "qkv"}
    fm = FEATURE_MAPS[feature_map]
    pos = offset + np.arange(len(x), dtype=np.float64)
    q, k = rotary(fm(proj["q"]), pos), rotary(fm(proj["k"]), pos)
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(proj["v"], groups, axis=1)
    nh, hk, e = q.shape[1], q.shape[-1], v.shape[-1]
    gamma = 1.0 - 2.0 ** (-5.0 - np.arange(nh))
    g = np.broadcast_to(np.log(gamma), (len(x), nh))
    o, _ = recurrence(q, k, v, g, np.zeros(len(x), bool), np.zeros((nh, hk, e)), hk**-0.5)
    return _norm_gate(p, o, x, "retention", eps)


# ------------------------------------------------ the kinds of the whole-model oracle (oracle.py)


def _conv_docs(x_LC: np.ndarray, w_KcC: np.ndarray, starts_L: np.ndarray) -> np.ndarray:
    """conv_silu restarted at every document start (taps before it read zeros)."""
    out, bounds = np.zeros_like(x_LC), [*np.nonzero(starts_L)[0], len(x_LC)]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        out[lo:hi] = conv_silu(x_LC[lo:hi], w_KcC)
    return out


def linear_layer(
    prefix: str,
    p: Params,
    spec: Any,
    base: Any,
    out: Any,
    *,
    feature_map: str | None = None,
    normalizer: float = 16.0,
    clamp_min: float | None = None,
) -> tuple[Any, Any]:
    """One GLA (prefix "gla") or retention ("retention") layer of oracle.py's model over one
    sequence: the mixer as gla_mixer / retention_mixer with the state restarting at packed
    documents (and their conv taps) and RetNet's rotary at the tokens' positions; the output
    copies (Orthros-H) read the state after their token with their own query
    (SiLU'd when the base query has a conv; SO alpha q' + beta before the feature map)."""
    import dataclasses

    from oracle import rms_norm, swiglu
    from oracle_gdn import doc_starts

    p = {n: np.asarray(a, np.float64) for n, a in p.items()}
    eps = spec.norm_eps
    ffn = lambda x: x + swiglu(rms_norm(x, p["mlp_norm"], eps), p["w_gate"], p["w_up"], p["w_down"])
    h = rms_norm(base.x, p["attn_norm"], eps)
    starts = doc_starts(base)
    proj = {n: np.einsum("ld,dhk->lhk", h, p[f"{prefix}_w{n}"]) for n in "qkv"}
    conv = f"{prefix}_conv_q" in p
    if conv:
        for n, y in proj.items():
            w = p[f"{prefix}_conv_{n}"]
            flat = _conv_docs(y.reshape(len(h), -1), w.reshape(w.shape[0], -1), starts)
            proj[n] = flat.reshape(y.shape)
    fm = FEATURE_MAPS[feature_map]
    qk = lambda x, pos: rotary(fm(x), pos) if prefix == "retention" else fm(x)
    pos = base.positions.astype(np.float64)
    q, k = qk(proj["q"], pos), qk(proj["k"], pos)
    nh, hk = q.shape[1], q.shape[-1]
    groups = nh // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(proj["v"], groups, axis=1)
    if prefix == "gla":
        gk = np.einsum("lr,rkh->lkh", h @ p["gla_wgk1"], p["gla_wgk2"]) + p["gla_bgk"]
        gk = logsigmoid(gk) / normalizer
        g = np.repeat(gk if clamp_min is None else np.maximum(gk, clamp_min), groups, axis=1)
    else:
        g = np.broadcast_to(np.log(1.0 - 2.0 ** (-5.0 - np.arange(nh))), (len(h), nh))
    states: list = []
    o, _ = recurrence(q, k, v, g, starts, np.zeros((nh, hk, v.shape[-1])), hk**-0.5, states)
    new_base = dataclasses.replace(base, x=ffn(base.x + _norm_gate(p, o, h, prefix, eps)))
    if out is None:
        return new_base, None
    ho = rms_norm(out.x, p["attn_norm"], eps)
    y_out = np.zeros_like(out.x)
    for i in range(len(ho)):
        (t,) = np.nonzero(
            (base.positions == out.positions[i]) & (base.segments == out.segments[i])
        )[0]
        qo = np.einsum("d,dnh->nh", ho[i], p[f"{prefix}_wq"])
        qo = 1.0 / (1.0 + np.exp(-qo)) * qo if conv else qo
        if spec.scale_offset:
            qo = qo * p[f"{prefix}_so_out_scale"] + p[f"{prefix}_so_out_offset"]
        qo = qk(qo[None], pos[t : t + 1])[0]
        oo = np.einsum("nh,nhe->ne", qo * hk**-0.5, states[t])
        y_out[i] = _norm_gate(p, oo[None], ho[i : i + 1], prefix, eps)[0]
    return new_base, dataclasses.replace(out, x=ffn(out.x + y_out))
