"""Analytic FLOP counts (multiply-add = 2 FLOPs) of prefill, decode and PT steps per arm.

These are the *necessary* FLOPs of each arm's math, not of our kernels: the sliding window
counts exactly min(t + 1, w) keys per query and causal attention (t + 1) keys, so a measured
speedup divided by the ratio of these counts says how close an implementation is to ideal.
Elementwise work (norms, softmax, RoPE) is ignored; it is O(T * D) for every arm. A gated
DeltaNet, GLA or retention layer counts its recurrent form (O(H dk dv) per token: the state
update and reads), not the chunked form's extra intra-chunk work; an Orthros-H output copy reads the state with
its own query, gate, out_proj and FFN.
"""

from __future__ import annotations

from orthros_jax.config import ModelConfig
from orthros_jax.layers.gdn_mixer import gdn_dims


def tokenwise_per_token(cfg: ModelConfig) -> dict[str, int]:
    """Matmul FLOPs one token spends in one layer outside attention, by part."""
    d, n, k, h, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    return {"q": 2 * d * n * h, "kv": 2 * 2 * d * k * h, "o": 2 * n * h * d, "mlp": 2 * 3 * d * f}


def _keys_window(t: int, window: int) -> int:
    """sum over positions 0..t-1 of min(pos + 1, window): keys a sliding window reads."""
    full = max(t - window, 0)
    ramp = min(t, window)
    return ramp * (ramp + 1) // 2 + full * window


def _keys_causal(t: int) -> int:
    return t * (t + 1) // 2


def gdn_per_token(cfg: ModelConfig) -> dict[str, int]:
    """FLOPs one token spends in one gated DeltaNet layer, by part: what carries the state
    (k/v/beta/decay projections, their conv, the rank-1 update with its k^T S read) and what
    reads it (q projection and conv, the gate z, q^T S, out_proj, FFN)."""
    d, kc = cfg.d_model, cfg.gdn_conv_kernel
    hk, hv, dk, dv = gdn_dims(cfg)
    return {
        "state": 2 * d * (hk * dk + hv * dv + 2 * hv) + 2 * kc * (hk * dk + hv * dv)
        + 4 * hv * dk * dv,
        "q": 2 * d * hk * dk + 2 * kc * hk * dk,
        "read": 2 * d * hv * dv + 2 * hv * dk * dv + 2 * hv * dv * d + 2 * 3 * d * cfg.d_ff,
    }  # fmt: skip


def linear_per_token(cfg: ModelConfig, kind: str) -> dict[str, int]:
    """FLOPs one token spends in one GLA / retention layer (layers/linear_mixer.py), by part as
    gdn_per_token: k/v (and GLA's low-rank decay gate and conv) projections and the update
    S = diag(a) S + k^T v; the q projection (and conv); the gate, q S, out_proj and FFN."""
    p = "gla" if kind == "gla" else "ret"
    d = cfg.d_model
    n, k, h, e = (getattr(cfg, f"{p}_{x}") for x in ("heads", "kv_heads", "k_head_dim",
                                                      "v_head_dim"))  # fmt: skip
    kc = cfg.gla_conv_kernel if kind == "gla" and cfg.gla_short_conv else 0
    state = 2 * d * k * (h + e) + 2 * kc * k * (h + e) + 3 * n * h * e
    if kind == "gla":
        state += 2 * cfg.gla_gate_rank * (d + k * h)
    gate = 2 * d * n * e * getattr(cfg, f"{p}_output_gate")
    return {
        "state": state,
        "q": 2 * d * n * h + 2 * kc * n * h,
        "read": gate + 2 * n * h * e + 2 * n * e * d + 2 * 3 * d * cfg.d_ff,
    }


def recurrent_per_token(cfg: ModelConfig, kind: str) -> dict[str, int] | None:
    """gdn_per_token / linear_per_token for a recurrent kind; None for attention."""
    if kind == "gdn":
        return gdn_per_token(cfg)
    return linear_per_token(cfg, kind) if kind in ("gla", "retention") else None


def _kinds(cfg: ModelConfig) -> list[str]:
    """The kind of every layer, in order."""
    return [kind for kind, _ in cfg.layer_slots()]


def prefill_flops(cfg: ModelConfig, t: int) -> int:
    """FLOPs to prefill a T-token prompt and produce the last position's logits.

    Every arm needs the state of every layer at every position (attention: K/V; GDN: the
    recurrent state). Only the last position's output is read, so the last layer's query/
    attention/FFN run for one token in all arms (orthros / orthros_h: its output copy;
    single-stream arms: the last token); the output copy runs every layer for one token.
    """
    parts = tokenwise_per_token(cfg)
    full_layer = sum(parts.values())
    att = 4 * cfg.n_heads * cfg.head_dim  # QK^T and PV per (query, key) pair
    one_token_rest = parts["q"] + parts["o"] + parts["mlp"]
    total = 2 * cfg.d_model * cfg.vocab_size
    window = cfg.base_window
    keys = _keys_causal(t) if window is None else _keys_window(t, window)
    kinds = _kinds(cfg)
    for i, kind in enumerate(kinds):
        last = i == len(kinds) - 1
        g = recurrent_per_token(cfg, kind)
        if g is not None:
            total += t * g["state"] + (1 if last or cfg.two_streams else t) * (g["q"] + g["read"])
            if cfg.two_streams and not last:  # the base stream's own outputs
                total += t * (g["q"] + g["read"])
            continue
        if not last:
            total += t * full_layer + att * keys
        elif not cfg.two_streams:
            total += (
                t * parts["kv"] + one_token_rest + att * (t if window is None else min(t, window))
            )
        else:
            total += t * parts["kv"]
        if cfg.two_streams:
            total += one_token_rest + att * t  # one output copy, global read
    return total


def floor_prefill_flops(cfg: ModelConfig, t: int) -> int:
    """The token-wise floor: the same prefill with attention replaced by identity."""
    parts = tokenwise_per_token(cfg)
    one_token_rest = parts["q"] + parts["o"] + parts["mlp"]
    body = (cfg.n_layers - 1) * t * sum(parts.values())
    return body + t * parts["kv"] + one_token_rest + 2 * cfg.d_model * cfg.vocab_size


def decode_flops(cfg: ModelConfig, context: int) -> int:
    """FLOPs of one decode step for one row at a cache of `context` tokens (new one included)."""
    parts = tokenwise_per_token(cfg)
    full_layer = sum(parts.values())
    att = 4 * cfg.n_heads * cfg.head_dim
    total = 2 * cfg.d_model * cfg.vocab_size
    window = cfg.base_window
    keys = context if window is None else min(context, window)
    kinds = _kinds(cfg)
    for i, kind in enumerate(kinds):
        dead = cfg.two_streams and i == len(kinds) - 1  # the last base output is never read
        g = recurrent_per_token(cfg, kind)
        if g is not None:
            total += g["state"] + (0 if dead else g["q"] + g["read"])
            total += (g["q"] + g["read"]) if cfg.two_streams else 0
            continue
        total += parts["kv"] if dead else full_layer + att * keys
        if cfg.two_streams:
            total += parts["q"] + parts["o"] + parts["mlp"] + att * context
    return total


def pt_forward_flops(cfg: ModelConfig, t: int) -> int:
    """Forward FLOPs of one PT row of T tokens with logits at every position (x3 for a step)."""
    parts = tokenwise_per_token(cfg)
    full_layer = sum(parts.values())
    att = 4 * cfg.n_heads * cfg.head_dim
    total = 2 * cfg.d_model * cfg.vocab_size * t
    window = cfg.base_window
    keys = _keys_causal(t) if window is None else _keys_window(t, window)
    kinds = _kinds(cfg)
    for i, kind in enumerate(kinds):
        dead = cfg.two_streams and i == len(kinds) - 1
        g = recurrent_per_token(cfg, kind)
        if g is not None:
            total += t * (g["state"] + (0 if dead else g["q"] + g["read"]))
            total += t * (g["q"] + g["read"]) if cfg.two_streams else 0
            continue
        total += t * parts["kv"] if dead else t * full_layer + att * keys
        if cfg.two_streams:
            total += t * (parts["q"] + parts["o"] + parts["mlp"]) + att * _keys_causal(t)
    return total
