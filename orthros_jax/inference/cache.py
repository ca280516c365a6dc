"""The KV cache: an explicit pytree holding every position of every layer's base K/V.

Layout (head-major):
  k, v     [layers, B, K, S, H]   attention layer, batch row, kv head, slot, head dim
  lengths  [B] int32              number of valid slots of each row
Head-major keeps each (row, kv head)'s history a contiguous [S, H] matrix, so the one-query
attention of a decode step is a plain batched mat-vec over the cache with no transpose (a
sequence-major cache was copy-transposed every layer; docs/performance.md has the figures).

Slot s of a row holds the K/V of the token at position s, so every mask is "slot < lengths"
(plus the window for the base stream). Slots >= lengths are stale or zero and are never read
unmasked. Orthros keeps the full history (the output stream reads all of it); the window
only limits what the base stream reads. Writes scatter with mode='drop': an out-of-range slot
is dropped, never clamped onto a valid entry (dynamic_update_slice would clamp). XLA lowers
a one-token write to an in-place dynamic-update-slice of one [K, H] entry.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig


@flax.struct.dataclass
class KVCache:
    """Per-layer base-stream K/V of a batch of sequences. See the module docstring."""

    k: jax.Array  # [layers, B, K, S, H]: the attention layers' K
    v: jax.Array  # [layers, B, K, S, H]
    lengths: jax.Array  # [B] int32
    linear: Any = None  # the gated-DeltaNet layers' state, stacked per layer (None without them)
    # the GLA / retention layers' states by kind name, each stacked per layer (None: neither)
    linear_attention: dict[str, Any] | None = None

    def states(self) -> dict[str, Any]:
        """Each layer kind's state, by kind name (what the layer steps read and write)."""
        out: dict[str, Any] = {"attention": (self.k, self.v)}
        if self.linear is not None:
            out["gdn"] = self.linear
        return out | (self.linear_attention or {})

    def with_states(self, states: dict[str, Any], lengths: jax.Array) -> KVCache:
        return KVCache.from_states({**self.states(), **states}, lengths)

    @staticmethod
    def from_states(states: dict[str, Any], lengths: jax.Array) -> KVCache:
        """The cache holding these kind states (keyed as `states()` returns them)."""
        k, v = states["attention"]
        others = {n: s for n, s in states.items() if n in ("gla", "retention")}
        return KVCache(k, v, lengths, states.get("gdn"), others or None)

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        """S, the number of slots per row."""
        return self.k.shape[3]


def cache_shape(cfg: ModelConfig, batch_size: int, max_len: int) -> tuple[int, ...]:
    """Shape of KVCache.k / .v: [attention layers, B, K, S, H]."""
    return (cfg.layers_of("attention"), batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)


def init_cache(
    cfg: ModelConfig,
    batch_size: int,
    max_len: int,
    dtype: jnp.dtype | str | None = None,
    *,
    mesh: Any = None,
) -> KVCache:
    """An empty cache of `max_len` slots per row, in `dtype` (default: the activation dtype).

    mesh: a jax.sharding.Mesh to split the cache over by sharding.RULES: rows over the batch
    axes, slots over "sequence" (sharding.sequence_mesh). With a sequence axis > 1, prefill,
    decode_step and generate run sequence-parallel on it (sp_forward.py). ValueError when the
    batch or max_len does not divide over the mesh."""
    for name, value in (("batch_size", batch_size), ("max_len", max_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"init_cache: {name} must be a positive int, got {value!r}")
    dtype = jnp.dtype(dtype or cfg.dtype)

    def empty() -> KVCache:
        states = kind_states(cfg, batch_size, max_len, dtype)
        return KVCache.from_states(states, jnp.zeros((batch_size,), jnp.int32))

    if mesh is None:
        return empty()
    from orthros_jax.inference import sequence_parallel as sp_forward
    from orthros_jax.parallel import sharding  # they import this module

    sp_forward.check_mesh(cfg, batch_size, max_len, mesh)
    return jax.jit(empty, out_shardings=sharding.cache_shardings(cfg, batch_size, max_len, mesh))()


def kind_states(cfg: ModelConfig, batch_size: int, max_len: int, dtype) -> dict[str, Any]:
    """Each layer kind's zero state stacked over its layers, by kind name, from the kind's
    own init_state (what KVCache.states() returns). The attention kind is always there (with
    0 layers in a pure GDN stack: its K/V give the cache its batch and slot sizes)."""
    from orthros_jax.layers.stack import KINDS  # the layer kinds import this module

    return {
        name: kind.init_state(cfg, cfg.layers_of(name), batch_size, max_len, dtype)
        for name, kind in KINDS.items()
        if name == "attention" or cfg.layers_of(name)
    }
