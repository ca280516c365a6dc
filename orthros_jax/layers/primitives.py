"""Parameter-free building blocks: RMSNorm, RoPE (Hugging Face rotate-half), SwiGLU, logits.

Shapes: B batch, L sequence, N query heads, H head_dim, D d_model, F d_ff, V vocab.
Parameters are passed in explicitly; each kind's ParamDecls name them (layers/kind.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, zero_centered: bool = False) -> jax.Array:
    """RMSNorm over the last axis with the variance in float32 (Llama/Qwen convention).

    x: [..., D], scale: [D]; zero_centered: the weight is stored as w with scale 1 + w, applied
    in float32 (Qwen3.5). Returns x's dtype.
    """
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    normed = x32 * jax.lax.rsqrt(var + eps)
    if zero_centered:
        return (normed * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
    # HF casts back to the activation dtype before multiplying by the weight.
    return scale.astype(x.dtype) * normed.astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> jax.Array:
    """Inverse frequencies [R/2] in float32, theta^(-2i / r) for r = cfg.rope_dim (R =
    cfg.rotary_dim, the rotated part of the head; transformers' rule, odd r included), with
    Llama-3 style scaling when configured."""
    r = cfg.rope_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, r, 2, dtype=jnp.float32) / r))
    if cfg.rope_type == "llama3":
        low_wavelen = cfg.rope_original_max_position / cfg.rope_low_freq_factor
        high_wavelen = cfg.rope_original_max_position / cfg.rope_high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > low_wavelen, inv_freq / cfg.rope_factor, inv_freq)
        smooth = (cfg.rope_original_max_position / wavelen - cfg.rope_low_freq_factor) / (
            cfg.rope_high_freq_factor - cfg.rope_low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = jnp.where(is_medium, smoothed, scaled)
    return inv_freq


def apply_rope(x_BLNH: jax.Array, positions_BL: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding in the HF rotate-half layout: pairs are (i, i + R/2) over the first
    R = 2 * len(inv_freq) dims of the head; the rest passes through (partial rotary).

    Angles come from the tokens' original positions, never their array index.
    """
    rot = 2 * inv_freq.shape[0]
    angles = positions_BL.astype(jnp.float32)[..., None] * inv_freq  # [B, L, R/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, L, 1, R]
    x32 = x_BLNH.astype(jnp.float32)
    xr, rest = x32[..., :rot], x32[..., rot:]
    half = rot // 2
    rotated = jnp.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    out = xr * jnp.cos(angles) + rotated * jnp.sin(angles)
    if rest.shape[-1]:
        out = jnp.concatenate([out, rest], axis=-1)
    return out.astype(x_BLNH.dtype)


def swiglu(
    x_BLD: jax.Array, w_gate_DF: jax.Array, w_up_DF: jax.Array, w_down_FD: jax.Array
) -> jax.Array:
    """SwiGLU feed-forward: down(silu(x gate) * (x up))."""
    dt = x_BLD.dtype
    gate = jnp.einsum("bld,df->blf", x_BLD, w_gate_DF.astype(dt))
    up = jnp.einsum("bld,df->blf", x_BLD, w_up_DF.astype(dt))
    return jnp.einsum("blf,fd->bld", jax.nn.silu(gate) * up, w_down_FD.astype(dt))


def embed(tokens_BL: jax.Array, embedding_VD: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """Token embeddings [B, L, D] (no scaling: Llama/Qwen convention)."""
    return jnp.take(embedding_VD, tokens_BL, axis=0).astype(dtype)


def lm_logits(x_BLD: jax.Array, head_DV: jax.Array) -> jax.Array:
    """Logits [B, L, V] in float32 from final hidden states and a [D, V] head."""
    return jnp.einsum(
        "bld,dv->blv", x_BLD, head_DV.astype(x_BLD.dtype), preferred_element_type=jnp.float32
    )
