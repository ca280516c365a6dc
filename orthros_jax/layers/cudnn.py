"""attention_impl="cudnn": `jax.nn.dot_product_attention(implementation="cudnn")` (cuDNN flash
attention, NVIDIA GPUs) behind the attend seam.

What cuDNN gets (q [B, Tq, N, H], keys [B, S, K, H]):
  aligned, default positions (one unpacked sequence: the benchmarks, prefill of one chunk)
      is_causal=True, with local_window_size=(w-1, 0) for the base window: no mask array.
  anything else in sequence / chunk mode (a packed batch, SFT's output copies, a chunk with its
      prefix): cuDNN has no segment ids, so the seam's mask goes in as an additive bias
      [B, 1, Tq, S] in q's dtype: O(B * Tq * S) memory per layer (launch/compile.py shows it).
  few queries (<= FEW_QUERIES per row: decode, a prompt's last token): the xla few-query dot, as
      for every implementation (a cache read of arbitrary slots is not a flash-attention tile).
Refused with a ValueError naming the case, before any compile, never run by another
implementation: a dtype other than bfloat16 / float16; head_dim not a multiple of 8 or above
256 (cuDNN allows 256 from Hopper, 128 before; cuDNN itself rejects 129-256 on older GPUs).
With a bias, cuDNN's training kernels need even query and key counts: an odd one is padded by
one invisible key / one query that is sliced away (a chunk of C with its W-1 prefix keys).
Under a mesh cuDNN runs per shard (kernel_mesh.py), as its partitioner needs q, k, v alike.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.kernels.attention import (
    KEY_PAD_SEGMENT,
    PAD_POSITION,
    QUERY_PAD_SEGMENT,
    visibility,
)
from orthros_jax.layers.attend import FEW_QUERIES, Keys, xla
from orthros_jax.layers.kernel_mesh import shard_rows_and_heads

DTYPES = ("bfloat16", "float16")
MAX_HEAD_DIM = 256  # Hopper and later; 128 before


def check_supported(q: jax.Array) -> None:
    """ValueError naming what cuDNN flash attention cannot run: q [B, Tq, N, H]."""
    dtype, h = jnp.dtype(q.dtype).name, q.shape[-1]
    if dtype not in DTYPES:
        raise ValueError(
            f"attention_impl='cudnn' needs ModelConfig.dtype in {DTYPES} (cuDNN flash "
            f"attention); got {dtype}: use attention_impl='xla' for {dtype}"
        )
    if h % 8 or h > MAX_HEAD_DIM:
        raise ValueError(
            f"attention_impl='cudnn' needs head_dim a multiple of 8 and <= {MAX_HEAD_DIM}; got "
            f"ModelConfig.head_dim={h}"
        )


def cudnn_attention(
    q: jax.Array,
    q_pos: jax.Array,
    q_seg: jax.Array,
    keys: Keys,
    window: int | None,
    cfg: ModelConfig,
) -> jax.Array:
    """The seam's "cudnn" implementation (see the module docstring). q [B, Lq, N, H] at
    (positions, segment ids) [B, Lq]; returns [B, Lq, N, H] in q's dtype."""

    check_supported(q)
    if q.shape[1] <= FEW_QUERIES:
        return xla(q, q_pos, q_seg, keys, window, cfg)
    plain = keys.aligned and keys.default_positions and keys.prefix is None
    full = keys if plain else keys.with_prefix()
    k, v = full.seq_major()
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    n, kv = q.shape[2], k.shape[2]
    if plain:
        local = None if window is None else (window - 1, 0)
        call = lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, local_window_size=local, implementation="cudnn"
        )
        return shard_rows_and_heads(call, (q, k, v), (2, 2, 2), n, kv)
    tq = q.shape[1]
    k_pos, k_seg = even(full.positions, PAD_POSITION), even(full.segment_ids, KEY_PAD_SEGMENT)
    mask = visibility(even(q_pos), even(q_seg, QUERY_PAD_SEGMENT), k_pos, k_seg, window)

    def masked(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="cudnn")

    args = (even(q), even(k), even(v), mask[:, None])
    out = shard_rows_and_heads(masked, args, (2, 2, 2, None), n, kv)
    return out[:, :tq].astype(q.dtype)


def even(x: jax.Array, value: Any = 0) -> jax.Array:
    """x [B, L, ...] padded along L to an even length with `value`."""
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, x.shape[1] % 2)
    return jnp.pad(x, widths, constant_values=value)
