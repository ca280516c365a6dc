"""Analytic FLOP counts (multiply-add = 2 FLOPs) of prefill, decode and PT steps per arm.

These are the *necessary* FLOPs of each arm's math, not of our kernels: the sliding window
counts exactly min(t + 1, w) keys per query and causal attention (t + 1) keys, so a measured
speedup divided by the ratio of these counts says how close an implementation is to ideal.
Elementwise work (norms, softmax, RoPE) is ignored; it is O(T * D) for every arm.
"""

from __future__ import annotations

from orthros_jax.config import ModelConfig


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


def prefill_flops(cfg: ModelConfig, t: int) -> int:
    """FLOPs to prefill a T-token prompt and produce the last position's logits.

    Every arm needs the K/V of every layer at every position. Only the last position's
    output is read, so the last layer's query/attention/FFN run for one token in all arms
    (orthros: its output copy; transformer/swa: the last token).
    """
    parts = tokenwise_per_token(cfg)
    full_layer = sum(parts.values())
    att = 4 * cfg.n_heads * cfg.head_dim  # QK^T and PV per (query, key) pair
    layers = cfg.n_layers
    one_token_rest = parts["q"] + parts["o"] + parts["mlp"]
    head = 2 * cfg.d_model * cfg.vocab_size
    if cfg.architecture == "orthros":
        base = (layers - 1) * (t * full_layer + att * _keys_window(t, cfg.window))
        base += t * parts["kv"]  # last layer: K/V only
        out = layers * (one_token_rest + att * t)  # one output copy per layer, global read
        return base + out + head
    keys = _keys_causal(t) if cfg.architecture == "transformer" else _keys_window(t, cfg.window)
    last_keys = t if cfg.architecture == "transformer" else min(t, cfg.window)
    body = (layers - 1) * (t * full_layer + att * keys)
    last = t * parts["kv"] + one_token_rest + att * last_keys
    return body + last + head


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
    head = 2 * cfg.d_model * cfg.vocab_size
    if cfg.architecture == "orthros":
        base = (cfg.n_layers - 1) * (full_layer + att * min(context, cfg.window)) + parts["kv"]
        out = cfg.n_layers * (parts["q"] + parts["o"] + parts["mlp"] + att * context)
        return base + out + head
    keys = context if cfg.architecture == "transformer" else min(context, cfg.window)
    return cfg.n_layers * (full_layer + att * keys) + head


def pt_forward_flops(cfg: ModelConfig, t: int) -> int:
    """Forward FLOPs of one PT row of T tokens with logits at every position (x3 for a step)."""
    parts = tokenwise_per_token(cfg)
    full_layer = sum(parts.values())
    att = 4 * cfg.n_heads * cfg.head_dim
    head = 2 * cfg.d_model * cfg.vocab_size * t
    if cfg.architecture == "orthros":
        base = (cfg.n_layers - 1) * (t * full_layer + att * _keys_window(t, cfg.window))
        base += t * parts["kv"]
        out = cfg.n_layers * t * (parts["q"] + parts["o"] + parts["mlp"])
        out += cfg.n_layers * att * _keys_causal(t)
        return base + out + head
    keys = _keys_causal(t) if cfg.architecture == "transformer" else _keys_window(t, cfg.window)
    return cfg.n_layers * (t * full_layer + att * keys) + head
