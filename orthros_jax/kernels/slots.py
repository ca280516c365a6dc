"""Cache slot reads and writes: array-only ops on one kind's stacked cache state.

A stacked state leaf is [layers, B, K, S, H] (head-major: each (row, kv head)'s history is a
contiguous [S, H] matrix). Slot s of a row holds the token at position s. Writes scatter with
mode='drop': an out-of-range slot (padding, a stopped row, another shard's slot) is dropped,
never clamped onto a valid entry (dynamic_update_slice would clamp). XLA lowers a one-token
write to an in-place dynamic-update-slice of one [K, H] entry.

A quantized stack (`QuantKV`: int8 or fp8 values [layers, B, K, S, H] and a float scale
[layers, B, K, S], one per token and kv head) is written quantized (scale = max |x| over H /
the dtype's largest value) and read dequantized (values * scale, in the scale's dtype), so
attention reads it as it reads a full-precision stack; XLA fuses the dequantization into the
read of each layer's slice.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

# Stored dtypes of a quantized K/V cache and the largest value each holds.
QUANT_MAX = {"int8": 127.0, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


class QuantKV(flax.struct.PyTreeNode):
    """A quantized K or V stack: values [layers, B, K, S, H] (int8 / fp8), scale [layers, B, K, S]
    (the full-precision dtype); value * scale is the stored vector."""

    values: Any  # jax.Array (or, in a tree of logical axes / shardings, what stands for it)
    scale: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)


Stack = Any  # jax.Array | QuantKV


def quant_zeros(shape: tuple[int, ...], kv_dtype: str, dtype: Any) -> QuantKV:
    """An empty quantized stack of shape [layers, B, K, S, H]; scales in `dtype`."""
    if kv_dtype not in QUANT_MAX:
        raise ValueError(
            f"kv_cache_dtype {kv_dtype!r} is not a quantized dtype ({list(QUANT_MAX)})"
        )
    return QuantKV(jnp.zeros(shape, kv_dtype), jnp.zeros(shape[:-1], dtype))


def quantize(x: jax.Array, kv_dtype: Any, scale_dtype: Any) -> tuple[jax.Array, jax.Array]:
    """(values [..., H] in kv_dtype, scale [...]) of x [..., H]: per-vector absmax scaling."""
    name = jnp.dtype(kv_dtype).name
    x = x.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x), axis=-1) / QUANT_MAX[name]
    scale = jnp.where(scale > 0, scale, 1.0).astype(scale_dtype)
    y = x / scale.astype(jnp.float32)[..., None]
    if jnp.issubdtype(kv_dtype, jnp.integer):
        y = jnp.round(y)
    y = jnp.clip(y, -QUANT_MAX[name], QUANT_MAX[name])
    return y.astype(kv_dtype), scale


def dequantize(values: jax.Array, scale: jax.Array) -> jax.Array:
    """values [..., H] * scale [...] in the scale's dtype."""
    return values.astype(scale.dtype) * scale[..., None]


def is_quantized(stack: Stack) -> bool:
    return isinstance(stack, QuantKV)


def _rows(slots_BT: jax.Array) -> jax.Array:
    bsz, t = slots_BT.shape
    return jnp.broadcast_to(jnp.arange(bsz, dtype=jnp.int32)[:, None], (bsz, t))


def write(cache_kv: Stack, layer: jax.Array | int, slots_BT: jax.Array, x_BTKH: jax.Array) -> Stack:
    """Writes x [B, T, K, H] into cache_kv [layers, B, K, S, H] at (layer, b, :, slots[b, t])
    (quantized first for a QuantKV).

    Slots outside [0, S) (padding, rows that stopped) are dropped, never clamped.
    """
    at = (layer, _rows(slots_BT), slice(None), slots_BT)
    if isinstance(cache_kv, QuantKV):
        q, scale = quantize(x_BTKH, cache_kv.values.dtype, cache_kv.scale.dtype)
        return QuantKV(
            cache_kv.values.at[at].set(q, mode="drop"),
            cache_kv.scale.at[at].set(scale, mode="drop"),
        )
    return cache_kv.at[at].set(x_BTKH.astype(cache_kv.dtype), mode="drop")


def read(cache_kv: Stack, layer: jax.Array | int, slots_BT: jax.Array) -> jax.Array:
    """Reads [B, K, T, H] from cache_kv [layers, B, K, S, H] at (layer, b, :, slots[b, t])
    (dequantized for a QuantKV).

    Out-of-range slots are clipped; callers mask them (they get an invalid segment).
    """
    slots = jnp.clip(slots_BT, 0, cache_kv.shape[3] - 1)
    at = (layer, _rows(slots_BT), slice(None), slots)
    if isinstance(cache_kv, QuantKV):
        return jnp.moveaxis(dequantize(cache_kv.values[at], cache_kv.scale[at]), 2, 1)
    return jnp.moveaxis(cache_kv[at], 2, 1)


def layer_block(
    cache_kv: Stack, layer: jax.Array | int, start: jax.Array | int, size: int
) -> jax.Array:
    """Slots start .. start + size - 1 of one layer's K or V, [B, K, size, H] (dequantized for a
    QuantKV): one dynamic slice of the stack, so a block is read without the whole layer being
    copied out first (start is clamped into the stack as dynamic_slice does)."""

    def take(a: jax.Array) -> jax.Array:
        at = (layer, 0, 0, start) + (0,) * (a.ndim - 4)
        return jax.lax.dynamic_slice(a, at, (1, *a.shape[1:3], size, *a.shape[4:]))[0]

    if isinstance(cache_kv, QuantKV):
        return dequantize(take(cache_kv.values), take(cache_kv.scale))
    return take(cache_kv)


def block_slots(cache_kv: Stack, kib: int) -> int:
    """Slots per block of layer_block reads of about kib KiB each (every row and kv head, in
    the dtype the block is read in), at least one."""
    quant = isinstance(cache_kv, QuantKV)
    values = cache_kv.values if quant else cache_kv
    dtype = cache_kv.scale.dtype if quant else cache_kv.dtype
    _, b, k, _, h = values.shape
    per_slot = b * k * h * jnp.dtype(dtype).itemsize
    return max(1, kib * 1024 // per_slot)


def layer_view(cache_kv: Stack, layer: jax.Array | int) -> jax.Array:
    """One layer's K or V, [B, K, S, H] (dequantized for a QuantKV)."""
    take = lambda a: jax.lax.dynamic_index_in_dim(a, layer, axis=0, keepdims=False)
    if isinstance(cache_kv, QuantKV):
        return dequantize(take(cache_kv.values), take(cache_kv.scale))
    return take(cache_kv)
