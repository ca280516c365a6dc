"""Cache slot reads and writes: array-only ops on one kind's stacked cache state.

A stacked state leaf is [layers, B, K, S, H] (head-major: each (row, kv head)'s history is a
contiguous [S, H] matrix). Slot s of a row holds the token at position s. Writes scatter with
mode='drop': an out-of-range slot (padding, a stopped row, another shard's slot) is dropped,
never clamped onto a valid entry (dynamic_update_slice would clamp). XLA lowers a one-token
write to an in-place dynamic-update-slice of one [K, H] entry.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _rows(slots_BT: jax.Array) -> jax.Array:
    bsz, t = slots_BT.shape
    return jnp.broadcast_to(jnp.arange(bsz, dtype=jnp.int32)[:, None], (bsz, t))


def write(
    cache_kv: jax.Array, layer: jax.Array | int, slots_BT: jax.Array, x_BTKH: jax.Array
) -> jax.Array:
    """Writes x [B, T, K, H] into cache_kv [layers, B, K, S, H] at (layer, b, :, slots[b, t]).

    Slots outside [0, S) (padding, rows that stopped) are dropped, never clamped.
    """
    x = x_BTKH.astype(cache_kv.dtype)
    return cache_kv.at[layer, _rows(slots_BT), :, slots_BT].set(x, mode="drop")


def read(cache_kv: jax.Array, layer: jax.Array | int, slots_BT: jax.Array) -> jax.Array:
    """Reads [B, K, T, H] from cache_kv [layers, B, K, S, H] at (layer, b, :, slots[b, t]).

    Out-of-range slots are clipped; callers mask them (they get an invalid segment).
    """
    slots = jnp.clip(slots_BT, 0, cache_kv.shape[3] - 1)
    return jnp.moveaxis(cache_kv[layer, _rows(slots_BT), :, slots], 2, 1)


def layer_view(cache_kv: jax.Array, layer: jax.Array | int) -> jax.Array:
    """One layer's K or V, [B, K, S, H]."""
    return jax.lax.dynamic_index_in_dim(cache_kv, layer, axis=0, keepdims=False)
