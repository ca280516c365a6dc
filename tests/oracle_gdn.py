"""The gated DeltaNet layer kind of the float64 oracle (oracle.py registers it in KINDS), token
by token from the equations, importing nothing from `orthros_jax`.

Where each fact comes from:
  The issue (13, item 1) and transformers' Qwen3_5GatedDeltaNet
    q, k, v = silu(causal depthwise conv(h W)) with h the attention-normed input (tap Kc-1
    multiplies the current token; taps before the document read zeros); q, k L2-normalised
    (x / sqrt(sum x^2 + 1e-6)), q scaled by dk^-1/2; value head j reads key head j // (Hv/Hk);
    beta = sigmoid(h W_b); g = -exp(A_log) * softplus(h W_a + dt_bias); the gated delta rule
    S_t = e^g S_{t-1} + k_t (beta (v_t - S'_t^T k_t))^T with S'_t = e^g S_{t-1}, o_t = S_t^T q_t;
    out = W_out (RMSNorm_w(o) * silu(h W_z)) per value head (plain scale w); then the FFN.
  The issue (item 3) and the project's choice (README / gdn.py)
    Orthros-H: the output copy of token t reads S_t with its own query q' = silu(h' W_q) (no
    conv), alpha * q' + beta (SO [Hk, dk]) before the L2 norm, its own z' = h' W_z; gate, norm,
    out_proj and FFN shared. A packed document restarts the state and the conv (its segment id
    changes or its position does not increase).
Shapes: L tokens, D d_model, Hk/Hv key/value heads, dk/dv their dims, Kc conv kernel.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from oracle import Params, Spec, Stream, rms_norm, swiglu


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


def conv_silu(pre_LHC: np.ndarray, w_KHC: np.ndarray, doc_L: np.ndarray) -> np.ndarray:
    """silu of the causal depthwise conv within each document. pre [L, heads, dim]."""
    kc = w_KHC.shape[0]
    out = np.zeros_like(pre_LHC)
    for t in range(len(pre_LHC)):
        for j in range(kc):
            s = t - (kc - 1) + j
            if s >= 0 and doc_L[s] == doc_L[t]:
                out[t] += w_KHC[j] * pre_LHC[s]
    return silu(out)


def to_value_heads(x_HkD: np.ndarray, hv: int) -> np.ndarray:
    return np.repeat(x_HkD, hv // x_HkD.shape[-2], axis=-2)


def gated_out(p: Params, o_HvV: np.ndarray, h_D: np.ndarray, eps: float) -> np.ndarray:
    """W_out (RMSNorm_w(o) * silu(h W_z)) for one token: [D]."""
    z = np.einsum("d,dhv->hv", h_D, p["gdn_wz"])
    normed = rms_norm(o_HvV, p["gdn_norm"], eps) * silu(z)
    return np.einsum("hv,hvd->d", normed, p["gdn_out"])


def gdn_layer(
    p: Params, spec: Spec, base: Stream, out: Stream | None, *, cross_silu: bool = True
) -> tuple[Stream, Stream | None]:
    """One GDN layer over a sequence: the base stream runs the rule and the output copies
    (Orthros-H) read the state after their token."""
    eps = spec.norm_eps
    h = rms_norm(base.x, p["attn_norm"], eps)
    doc = np.cumsum(doc_starts(base))
    hv, dk = p["gdn_wv"].shape[1], p["gdn_wq"].shape[2]
    q, k, v = (
        conv_silu(np.einsum("ld,dhc->lhc", h, p[f"gdn_w{n}"]), p[f"gdn_conv_{n}"], doc)
        for n in "qkv"
    )
    q = to_value_heads(l2norm(q) * dk**-0.5, hv)
    k = to_value_heads(l2norm(k), hv)
    beta = 1.0 / (1.0 + np.exp(-(h @ p["gdn_wb"])))  # [L, Hv]
    a = h @ p["gdn_wa"] + p["gdn_dt_bias"]
    g = -np.exp(p["gdn_a_log"]) * np.log1p(np.exp(a))
    states, y = [], np.zeros_like(base.x)
    s = np.zeros((hv, dk, v.shape[-1]))
    for t in range(len(h)):
        if t == 0 or doc[t] != doc[t - 1]:
            s = np.zeros_like(s)
        s = np.exp(g[t])[:, None, None] * s
        delta = beta[t][:, None] * (v[t] - np.einsum("hk,hkv->hv", k[t], s))
        s = s + k[t][:, :, None] * delta[:, None, :]
        states.append(s)
        y[t] = gated_out(p, np.einsum("hk,hkv->hv", q[t], s), h[t], eps)
    new_base = dataclasses.replace(base, x=_ffn(p, base.x + y, eps))
    if out is None:
        return new_base, None
    ho = rms_norm(out.x, p["attn_norm"], eps)
    y_out = np.zeros_like(out.x)
    for i in range(len(ho)):
        (t,) = np.nonzero(
            (base.positions == out.positions[i]) & (base.segments == out.segments[i])
        )[0]
        qo = np.einsum("d,dhc->hc", ho[i], p["gdn_wq"])
        qo = silu(qo) if cross_silu else qo
        if spec.scale_offset:
            qo = p["gdn_so_out_scale"] * qo + p["gdn_so_out_offset"]
        qo = to_value_heads(l2norm(qo) * dk**-0.5, hv)
        y_out[i] = gated_out(p, np.einsum("hk,hkv->hv", qo, states[t]), ho[i], eps)
    return new_base, dataclasses.replace(out, x=_ffn(p, out.x + y_out, eps))


def _ffn(p: Params, x: np.ndarray, eps: float) -> np.ndarray:
    return x + swiglu(rms_norm(x, p["mlp_norm"], eps), p["w_gate"], p["w_up"], p["w_down"])


def gdn_param_names(spec: Spec) -> set[str]:
    """The per-layer parameter names a GDN layer reads."""
    names = {"attn_norm", "mlp_norm", "w_gate", "w_up", "w_down", "gdn_dt_bias", "gdn_a_log"}
    names |= {f"gdn_{n}" for n in ("wq", "wk", "wv", "wz", "wb", "wa", "norm", "out")}
    names |= {f"gdn_conv_{n}" for n in "qkv"}
    if spec.scale_offset:
        names |= {"gdn_so_out_scale", "gdn_so_out_offset"}
    return names
