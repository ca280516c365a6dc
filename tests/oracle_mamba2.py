"""A float64 NumPy oracle of one Mamba-2 layer (token by token, no chunking), independent of
orthros_jax (it imports nothing of the package): the reference that tests/test_mamba2.py holds
the `mamba2` kind to.

The layer (Mamba-2's SSD block as transformers' Mamba2Mixer computes it, inside our block):
    h = rmsnorm(x) * attn_norm
    z, xs, b, c, dt = h Wz (+bz), h Wx (+bx), h Wb (+bb), h Wc (+bc), h Wdt (+bdt)
    xs, b, c = silu(causal depthwise conv (+ conv bias)) of each, within the document
    dt = clip(softplus(dt + dt_bias), dt_min, dt_max);  A = -exp(a_log)
    per head n (group g = n // (heads / groups)), state S [state, head_dim]:
        S = exp(dt_n A_n) S + dt_n b_g^T xs_n;   y_n = c_g S + D_n xs_n
    y = rmsnorm over each group of heads (y * silu(z)) * norm;   x += y Wo (+ out_bias)
    then, when the block has its FFN, x += swiglu(rmsnorm(x) * mlp_norm)
An Orthros-H output copy at base token t (cross_x given) reads S after token t with its own
c' = silu(h' Wc (+bc)) * so_scale + so_offset (no conv), its own skip xs' = silu(h' Wx (+bx))
and gate z' = h' Wz (+bz); norm, Wo and the FFN are shared.

Parameters: one layer's dict of arrays under the names of orthros_jax/layers/mamba2.py
(mamba2_wz [D, heads, head_dim], ..., attn_norm, and mlp_norm / w_gate / w_up / w_down when
the block has its FFN); optional ones (biases, SO) are simply absent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

f64 = np.float64


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _rms(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def _get(p: dict[str, Any], name: str) -> np.ndarray | None:
    value = p.get(f"mamba2_{name}")
    return None if value is None else np.asarray(value, f64)


def _proj(p: dict[str, Any], h: np.ndarray, name: str) -> np.ndarray:
    """h [T, D] @ W [D, ...] (+ bias)."""
    w = _get(p, f"w{name}")
    assert w is not None
    y = np.tensordot(h, w, axes=1)
    bias = _get(p, f"b{name}")
    return y if bias is None else y + bias


def _conv(p: dict[str, Any], x: np.ndarray, name: str, reset: np.ndarray) -> np.ndarray:
    """silu(causal depthwise conv + bias) of x [T, ...] (w[K-1] on the token itself), never
    reaching across a document start."""
    w = _get(p, f"conv_{name}")
    assert w is not None
    k, t = w.shape[0], x.shape[0]
    doc = np.cumsum(reset)
    out = np.zeros_like(x)
    for i in range(t):
        acc = np.zeros(x.shape[1:], f64)
        for lag in range(k):
            j = i - lag
            if j >= 0 and doc[j] == doc[i]:
                acc += w[k - 1 - lag] * x[j]
        bias = _get(p, f"conv_{name}_bias")
        out[i] = _silu(acc if bias is None else acc + bias)
    return out


def _finish(p: dict[str, Any], y: np.ndarray, z: np.ndarray, groups: int, eps: float) -> np.ndarray:
    """Gated grouped RMSNorm and out_proj: y, z [T, heads, head_dim] -> [T, D]."""
    t, n, e = y.shape
    g = y * _silu(z)
    g = g.reshape(t, groups, (n // groups) * e)
    g = _rms(g, None, eps).reshape(t, n, e) * _get(p, "norm")
    out = np.tensordot(g, _get(p, "out"), axes=2)
    bias = _get(p, "out_bias")
    return out if bias is None else out + bias


def _ffn(p: dict[str, Any], x: np.ndarray, eps: float) -> np.ndarray:
    h = _rms(x, np.asarray(p["mlp_norm"], f64), eps)
    gate = h @ np.asarray(p["w_gate"], f64)
    return x + (_silu(gate) * (h @ np.asarray(p["w_up"], f64))) @ np.asarray(p["w_down"], f64)


def layer(
    p: dict[str, Any],
    x: np.ndarray,
    reset: np.ndarray,
    *,
    groups: int,
    eps: float,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    ffn: bool = True,
    cross_x: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """One Mamba-2 layer over one row: x [T, D]; reset [T] bool (a document starts at the token;
    reset[0] is implied); cross_x [T, D]: the output copy of each base token (Orthros-H).
    Returns (new x [T, D], new cross_x or None)."""
    x = np.asarray(x, f64)
    reset = np.asarray(reset, bool).copy()
    reset[0] = True
    h = _rms(x, np.asarray(p["attn_norm"], f64), eps)
    z, xs, b, c = (_proj(p, h, n) for n in ("z", "x", "b", "c"))
    dt = _proj(p, h, "dt")
    xs, b, c = (_conv(p, a, n, reset) for a, n in ((xs, "x"), (b, "b"), (c, "c")))
    dt = np.clip(_softplus(dt + _get(p, "dt_bias")), *dt_limit)  # [T, heads]
    a = -np.exp(_get(p, "a_log"))
    d = _get(p, "d")
    t, n, e = xs.shape
    per = n // groups
    cross = cross_x is not None
    if cross:
        hc = _rms(np.asarray(cross_x, f64), np.asarray(p["attn_norm"], f64), eps)
        zc, xc = _proj(p, hc, "z"), _silu(_proj(p, hc, "x"))
        cc = _silu(_proj(p, hc, "c"))
        scale, offset = _get(p, "so_out_scale"), _get(p, "so_out_offset")
        if scale is not None:
            cc = cc * scale + offset
    y = np.zeros((t, n, e), f64)
    yc = np.zeros((t, n, e), f64)
    s = np.zeros((n, b.shape[-1], e), f64)
    for i in range(t):
        if reset[i]:
            s[:] = 0.0
        for head in range(n):
            grp = head // per
            s[head] = np.exp(dt[i, head] * a[head]) * s[head] + dt[i, head] * np.outer(
                b[i, grp], xs[i, head]
            )
            y[i, head] = c[i, grp] @ s[head] + d[head] * xs[i, head]
            if cross:
                yc[i, head] = cc[i, grp] @ s[head] + d[head] * xc[i, head]
    out = x + _finish(p, y, z, groups, eps)
    out_c = np.asarray(cross_x, f64) + _finish(p, yc, zc, groups, eps) if cross else None
    if ffn:
        out = _ffn(p, out, eps)
        out_c = None if out_c is None else _ffn(p, out_c, eps)
    return out, out_c
