"""The dense specification of attention: T x S scores masked by `visibility`, in float32.
What the blocked kernels of attention.py are tested against (never used by the model)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from orthros_jax.kernels.attention import _MASKED, _default_segments, visibility


def reference_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    q_positions: jax.Array,
    k_positions: jax.Array,
    q_segment_ids: jax.Array | None = None,
    k_segment_ids: jax.Array | None = None,
    window: int | None = None,
) -> jax.Array:
    """Dense masked attention (Lq x Lk scores) — the specification the kernels are tested
    against."""
    bsz, lq, n, h = q.shape
    kv = k.shape[2]
    q_seg = _default_segments(q_segment_ids, q)
    k_seg = _default_segments(k_segment_ids, k)
    kr = jnp.repeat(k, n // kv, axis=2).astype(jnp.float32)
    vr = jnp.repeat(v, n // kv, axis=2).astype(jnp.float32)
    s = jnp.einsum("bqnh,bsnh->bnqs", q.astype(jnp.float32), kr) / math.sqrt(h)
    mask = visibility(q_positions, q_seg, k_positions, k_seg, window)
    s = jnp.where(mask[:, None], s, _MASKED)
    return jnp.einsum("bnqs,bsnh->bqnh", jax.nn.softmax(s, axis=-1), vr).astype(q.dtype)
