"""The gated DeltaNet layer kind of the float64 oracle (oracle.py registers it in KINDS), token
by token from the equations, importing nothing from `orthros_jax`; and `gdn_mix_reference`,
the same mixer with gdn.gdn_mix's contract (a carried state, padding, resets), for test_gdn.

Where each fact comes from:
  The issue (13, item 1) and transformers' Qwen3_5GatedDeltaNet
    q, k, v = silu(causal depthwise conv(h W)) with h the attention-normed input (tap Kc-1
    multiplies the current token; taps before the document read zeros); q, k L2-normalised
    (x / sqrt(sum x^2 + 1e-6)), q scaled by dk^-1/2; value head j reads key head j // (Hv/Hk);
    beta = sigmoid(h W_b); g = -exp(A_log) * softplus(h W_a + dt_bias); the gated delta rule
    S_t = e^g S_{t-1} + k_t (beta (v_t - S'_t^T k_t))^T with S'_t = e^g S_{t-1}, o_t = S_t^T q_t;
    out = W_out (RMSNorm_w(o) * silu(h W_z)) per value head (plain scale w); then the FFN.
  The issue (item 3) and the project's choice (docs/models.md / gdn.py)
    Orthros-H: the output copy of token t reads S_t with its own query q' = silu(h' W_q) (no
    conv), alpha * q' + beta (SO [Hk, dk]) before the L2 norm, its own z' = h' W_z; gate, norm,
    out_proj and FFN shared. A packed document restarts the state and the conv (its segment id
    changes or its position does not increase).
Shapes: L tokens, D d_model, Hk/Hv key/value heads, dk/dv their dims, Kc conv kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from oracle import Params, Spec, Stream, rms_norm, swiglu, to_float64

QKV = ("q", "k", "v")


def silu(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def doc_starts(stream: Stream) -> np.ndarray:
    """[L] True where a document starts (first token, new segment, position not increasing)."""
    start = np.ones(len(stream.positions), bool)
    start[1:] = (stream.segments[1:] != stream.segments[:-1]) | (
        stream.positions[1:] <= stream.positions[:-1]
    )
    return start


def to_value_heads(x_HkD: np.ndarray, hv: int) -> np.ndarray:
    return np.repeat(x_HkD, hv // x_HkD.shape[-2], axis=-2)


def gated_out(p: Params, o_HvV: np.ndarray, h_D: np.ndarray, eps: float) -> np.ndarray:
    """W_out (RMSNorm_w(o) * silu(h W_z)) for one token: [D]."""
    z = np.einsum("d,dhv->hv", h_D, p["gdn_wz"])
    normed = rms_norm(o_HvV, p["gdn_norm"], eps) * silu(z)
    return np.einsum("hv,hvd->d", normed, p["gdn_out"])


def base_mixer(
    p: Params,
    h_LD: np.ndarray,
    eps: float,
    valid_L: np.ndarray,
    reset_L: np.ndarray,
    conv: dict[str, np.ndarray],
    s_HvKV: np.ndarray,
) -> tuple[np.ndarray, list[np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """The base stream's mixer over one row, token by token, from the normed input h [L, D].

    conv: q/k/v -> the last Kc-1 valid pre-conv inputs before the row [Kc-1, heads, dim];
    s [Hv, dk, dv]: the state before it. A padding token (valid False) moves neither and
    outputs 0; a reset (at a valid token) zeroes both before the token. Returns (y [L, D], the
    state after each token [L x (Hv, dk, dv)], conv, s at the end of the row)."""
    hv, dk = p["gdn_wv"].shape[1], p["gdn_wq"].shape[2]
    y, states = np.zeros_like(h_LD), []
    for t, h in enumerate(h_LD):
        if valid_L[t]:
            if reset_L[t]:
                conv = {n: np.zeros_like(c) for n, c in conv.items()}
                s_HvKV = np.zeros_like(s_HvKV)
            mixed = {}
            for n in QKV:
                window = np.concatenate([conv[n], np.einsum("d,dhc->hc", h, p[f"gdn_w{n}"])[None]])
                mixed[n] = silu(np.einsum("jhc,jhc->hc", window, p[f"gdn_conv_{n}"]))
                conv = {**conv, n: window[1:]}
            q = to_value_heads(l2norm(mixed["q"]) * dk**-0.5, hv)
            k = to_value_heads(l2norm(mixed["k"]), hv)
            beta = 1.0 / (1.0 + np.exp(-(h @ p["gdn_wb"])))  # [Hv]
            g = -np.exp(p["gdn_a_log"]) * np.logaddexp(0.0, h @ p["gdn_wa"] + p["gdn_dt_bias"])
            s_HvKV = np.exp(g)[:, None, None] * s_HvKV
            delta = beta[:, None] * (mixed["v"] - np.einsum("hk,hkv->hv", k, s_HvKV))
            s_HvKV = s_HvKV + k[:, :, None] * delta[:, None, :]
            y[t] = gated_out(p, np.einsum("hk,hkv->hv", q, s_HvKV), h, eps)
        states.append(s_HvKV)
    return y, states, conv, s_HvKV


def cross_read(
    p: Params,
    h_D: np.ndarray,
    s_HvKV: np.ndarray,
    eps: float,
    so: tuple[np.ndarray, np.ndarray] | None,
    cross_silu: bool = True,
) -> np.ndarray:
    """An output copy's mixer output [D] from its normed hidden state h' [D] over the state
    after its token: q' = silu(h' W_q) (no conv), SO (scale, offset) [Hk, dk] before the L2
    norm, then the base query's normalisation."""
    hv, dk = s_HvKV.shape[:2]
    q = np.einsum("d,dhc->hc", h_D, p["gdn_wq"])
    q = silu(q) if cross_silu else q
    if so is not None:
        q = so[0] * q + so[1]
    q = to_value_heads(l2norm(q) * dk**-0.5, hv)
    return gated_out(p, np.einsum("hk,hkv->hv", q, s_HvKV), h_D, eps)


def empty_state(p: Params) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A zero conv window per q/k/v [Kc-1, heads, dim] and a zero state [Hv, dk, dv]."""
    conv = {n: np.zeros_like(p[f"gdn_conv_{n}"][1:]) for n in QKV}
    hv, dk, dv = p["gdn_wv"].shape[1], p["gdn_wq"].shape[2], p["gdn_wv"].shape[2]
    return conv, np.zeros((hv, dk, dv))


def gdn_layer(
    p: Params, spec: Spec, base: Stream, out: Stream | None, *, cross_silu: bool = True
) -> tuple[Stream, Stream | None]:
    """One GDN layer over a sequence: the base stream runs the rule and the output copies
    (Orthros-H) read the state after their token."""
    eps = spec.norm_eps
    h = rms_norm(base.x, p["attn_norm"], eps)
    every = np.ones(len(h), bool)
    y, states, _, _ = base_mixer(p, h, eps, every, doc_starts(base), *empty_state(p))
    new_base = dataclasses.replace(base, x=_ffn(p, base.x + y, eps))
    if out is None:
        return new_base, None
    ho = rms_norm(out.x, p["attn_norm"], eps)
    so = (p["gdn_so_out_scale"], p["gdn_so_out_offset"]) if spec.scale_offset else None
    y_out = np.zeros_like(out.x)
    for i in range(len(ho)):
        (t,) = np.nonzero(
            (base.positions == out.positions[i]) & (base.segments == out.segments[i])
        )[0]
        y_out[i] = cross_read(p, ho[i], states[t], eps, so, cross_silu)
    return new_base, dataclasses.replace(out, x=_ffn(p, out.x + y_out, eps))


def _ffn(p: Params, x: np.ndarray, eps: float) -> np.ndarray:
    return x + swiglu(rms_norm(x, p["mlp_norm"], eps), p["w_gate"], p["w_up"], p["w_down"])


def gdn_param_names(spec: Spec) -> set[str]:
    """The per-layer parameter names a GDN layer reads."""
    names = {"attn_norm", "mlp_norm", "w_gate", "w_up", "w_down", "gdn_dt_bias", "gdn_a_log"}
    names |= {f"gdn_{n}" for n in ("wq", "wk", "wv", "wz", "wb", "wa", "norm", "out")}
    names |= {f"gdn_conv_{n}" for n in QKV}
    if spec.scale_offset:
        names |= {"gdn_so_out_scale", "gdn_so_out_offset"}
    return names


def gdn_mix_reference(
    p: Params,
    h_BLD: Any,
    cfg: Any,
    *,
    state: Any = None,
    valid_BL: Any = None,
    reset_BL: Any = None,
    cross_h_BLD: Any = None,
    cross_so: tuple[Any, Any] | None = None,
    cross_silu: bool = True,
) -> tuple[np.ndarray, np.ndarray | None, dict[str, np.ndarray]]:
    """gdn.gdn_mix's contract, row by row in float64 (cfg: only norm_eps is read).

    p: one layer's gdn_* parameters; h_BLD (and cross_h_BLD) the normed input [B, L, D];
    state: a GDNState (conv_q/k/v [B, Kc-1, heads, dim], recurrent [B, Hv, dk, dv]) or None;
    valid_BL / reset_BL as gdn_mix's. The cross stream reads the state after its base token and
    is 0 at padding. Returns (y [B, L, D], cross_y [B, L, D] or None, the state as a dict)."""
    f = to_float64(p)
    h = np.asarray(h_BLD, np.float64)
    b, seq, _ = h.shape
    valid = np.ones((b, seq), bool) if valid_BL is None else np.asarray(valid_BL, bool)
    reset = np.zeros((b, seq), bool) if reset_BL is None else np.asarray(reset_BL, bool)
    cross = None if cross_h_BLD is None else np.asarray(cross_h_BLD, np.float64)
    so = None if cross_so is None else tuple(np.asarray(x, np.float64) for x in cross_so)
    y, cross_y = np.zeros_like(h), None if cross is None else np.zeros_like(h)
    ends = []
    for r in range(b):
        conv, s = empty_state(f)
        if state is not None:
            conv = {n: np.asarray(getattr(state, f"conv_{n}")[r], np.float64) for n in QKV}
            s = np.asarray(state.recurrent[r], np.float64)
        y[r], states, conv, s = base_mixer(f, h[r], cfg.norm_eps, valid[r], reset[r], conv, s)
        ends.append({**{f"conv_{n}": conv[n] for n in QKV}, "recurrent": s})
        if cross is not None:
            for t in np.flatnonzero(valid[r]):
                cross_y[r, t] = cross_read(f, cross[r, t], states[t], cfg.norm_eps, so, cross_silu)
    return y, cross_y, {name: np.stack([e[name] for e in ends]) for name in ends[0]}
