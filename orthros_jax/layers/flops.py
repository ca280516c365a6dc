"""Analytic FLOP counts (multiply-add = 2 FLOPs) of prefill, decode and training steps of any
arm: the training loop's MFU (training/throughput.py) and the benchmarks' and launch/compile.py's
rooflines read the same counts.

These are the *necessary* FLOPs of each arm's math, not of our kernels: the sliding window
counts exactly min(t + 1, w) keys per query and causal attention (t + 1) keys, so a measured
speedup divided by the ratio of these counts says how close an implementation is to ideal.
Elementwise work (norms, softmax, RoPE) is ignored; it is O(T * D) for every arm. Each layer
kind declares its own count (LayerKind.flops of a `Work`: tokens that write state, base outputs
needed, output copies, and the FLOPs per token of the layer's FFN, which each FFN choice
declares: layers/ffn.py, so a mixture of experts counts its router, top-k experts and shared
expert); this module only says which work each mode asks of each layer.
"""

from __future__ import annotations

from orthros_jax.config import ModelConfig
from orthros_jax.layers import attention, ffn
from orthros_jax.layers.kind import Work
from orthros_jax.layers.registry import KINDS


def _head(cfg: ModelConfig, rows: int) -> int:
    return 2 * cfg.d_model * cfg.vocab_size * rows


def _layers(cfg: ModelConfig, work_of: list[dict[str, int]]) -> int:
    """Every layer's count for its work (tokens, context, base_outputs, copies) and its FFN."""
    slots, per_ffn = cfg.layer_slots(), ffn.layer_flops(cfg)
    return sum(
        KINDS[kind].flops(cfg, Work(**w, ffn=f))
        for (kind, _), w, f in zip(slots, work_of, per_ffn, strict=True)
    )


def prefill_flops(cfg: ModelConfig, t: int) -> int:
    """FLOPs to prefill a T-token prompt and produce the last position's logits.

    Every arm needs the state of every layer at every position (attention: K/V; GDN: the
    recurrent state). Only the last position's output is read, so the last layer's base output
    is needed for one token in the single-stream arms and not at all in the two-stream arms,
    whose output copy of the last token runs every layer."""
    n, two = cfg.n_layers, cfg.two_streams
    work = [
        dict(
            tokens=t,
            context=t,
            base_outputs=t if i < n - 1 else (0 if two else 1),
            copies=1 if two else 0,
        )
        for i in range(n)
    ]
    return _head(cfg, 1) + _layers(cfg, work)


def decode_flops(cfg: ModelConfig, context: int) -> int:
    """FLOPs of one decode step for one row at a cache of `context` tokens (new one included)."""
    n, two = cfg.n_layers, cfg.two_streams
    work = [
        dict(
            tokens=1,
            context=context,
            base_outputs=0 if two and i == n - 1 else 1,
            copies=1 if two else 0,
        )
        for i in range(n)
    ]
    return _head(cfg, 1) + _layers(cfg, work)


def pt_forward_flops(cfg: ModelConfig, t: int) -> int:
    """Forward FLOPs of one PT row of T tokens with logits at every position (x3 for a step)."""
    return train_forward_flops(cfg, t, t)


def train_forward_flops(cfg: ModelConfig, t: int, out_len: int) -> int:
    """Forward FLOPs of one training row of T tokens whose logits are taken at out_len
    positions: PT (out_len = T) or SFT (the output stream's copies at the answer-predicting
    positions, counted as the last out_len positions: an upper bound on their keys)."""
    n, two = cfg.n_layers, cfg.two_streams
    work = [
        dict(
            tokens=t,
            context=t,
            base_outputs=0 if two and i == n - 1 else t,
            copies=out_len if two else 0,
        )
        for i in range(n)
    ]
    return _head(cfg, out_len) + _layers(cfg, work)


def train_step_flops(cfg: ModelConfig, rows: int, t: int, out_len: int) -> int:
    """Model FLOPs of one training micro-batch of `rows` rows: forward + backward = 3 x the
    forward (rematerialisation's and the chunked loss's recompute are not counted)."""
    return 3 * rows * train_forward_flops(cfg, t, out_len)


def floor_prefill_flops(cfg: ModelConfig, t: int) -> int:
    """The token-wise floor of an attention stack: the same prefill with attention replaced by
    identity (every layer's projections and FFN for every token, the last layer's for one)."""
    parts, per_ffn = attention.tokenwise_flops(cfg), ffn.layer_flops(cfg)
    body = t * sum(sum(parts.values()) + f for f in per_ffn[:-1])
    return body + t * parts["kv"] + parts["q"] + parts["o"] + per_ffn[-1] + _head(cfg, 1)
