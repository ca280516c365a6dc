"""The KV cache: an explicit pytree holding every position of every layer's base K/V.

Layout (sequence-major, the layout the attention kernels use, so no transpose is needed):
  k, v     [L, B, S, K, H]   layer, batch row, slot, kv head, head dim
  lengths  [B] int32         number of valid slots of each row
Slot s of a row holds the K/V of the token at position s: positions are slot indices, so
every mask is "slot < lengths" (plus the window for the base stream). Entries at slots
>= lengths are stale or zero and are never read unmasked.

Orthros keeps the full history (the output stream reads all of it); the window only limits
what the base stream reads. Writes go through `scatter` with mode='drop' so an out-of-range
slot is dropped, never clamped onto a valid entry (dynamic_update_slice would clamp).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig


@flax.struct.dataclass
class KVCache:
    """Per-layer base-stream K/V of a batch of sequences. See the module docstring."""

    k: jax.Array  # [L, B, S, K, H]
    v: jax.Array  # [L, B, S, K, H]
    lengths: jax.Array  # [B] int32

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        """S, the number of slots per row."""
        return self.k.shape[2]


def init_cache(
    cfg: ModelConfig, batch_size: int, max_len: int, dtype: jnp.dtype | str | None = None
) -> KVCache:
    """An empty cache of `max_len` slots per row, in `dtype` (default: the activation dtype)."""
    for name, value in (("batch_size", batch_size), ("max_len", max_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"init_cache: {name} must be a positive int, got {value!r}")
    dtype = jnp.dtype(dtype or cfg.dtype)
    shape = (cfg.n_layers, batch_size, max_len, cfg.n_kv_heads, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )


def write(
    cache_l: jax.Array, layer: jax.Array | int, slots_BT: jax.Array, x: jax.Array
) -> jax.Array:
    """Writes x [B, T, K, H] into cache_l [L, B, S, K, H] at (layer, b, slots[b, t]).

    Slots outside [0, S) (padding, rows that stopped) are dropped, never clamped.
    """
    bsz, t = slots_BT.shape
    rows = jnp.broadcast_to(jnp.arange(bsz, dtype=jnp.int32)[:, None], (bsz, t))
    return cache_l.at[layer, rows, slots_BT].set(x.astype(cache_l.dtype), mode="drop")


def gather(cache_l: jax.Array, layer: jax.Array | int, slots_BT: jax.Array) -> jax.Array:
    """Reads [B, T, K, H] from cache_l [L, B, S, K, H] at (layer, b, slots[b, t]).

    Out-of-range slots are clipped; callers mask them (they carry an invalid segment).
    """
    bsz, t = slots_BT.shape
    rows = jnp.broadcast_to(jnp.arange(bsz, dtype=jnp.int32)[:, None], (bsz, t))
    s = cache_l.shape[2]
    return cache_l[layer, rows, jnp.clip(slots_BT, 0, s - 1)]


def layer_view(cache_l: jax.Array, layer: jax.Array | int) -> jax.Array:
    """One layer's K or V, [B, S, K, H]."""
    return jax.lax.dynamic_index_in_dim(cache_l, layer, axis=0, keepdims=False)
