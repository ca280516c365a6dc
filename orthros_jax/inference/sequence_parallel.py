"""Sequence-parallel prefill and decode: drivers.py's prefill and decode on each shard of a KV
cache whose slots are split over the "sequence" mesh axis (rows over the batch axes, e.g.
"data"), inside one `jax.shard_map`.

Shapes: B batch (b per shard), S cache slots (Ls = S / P per shard of P), C chunk, D d_model,
V vocab, W window. Shard i owns slots [i * Ls, (i + 1) * Ls) of every row. Positions, window
slots and masks stay global slot ids; a shard writes only the slots it owns and sees other
shards' keys only through collectives. Each shard runs the drivers with slot_offset = i * Ls
(its cache view is parallel/sequence.ShardView) and sequence parallelism's attention
implementation (parallel/sequence.SequenceAttention).

prefill: tokens on the slot grid [B, S] (`slot_tokens`: the token at slot s of row b is prompt
token s - start_b, start = cache.lengths, so a prompt continues a partly filled cache and slots
outside [start, end) keep what they hold). A shard runs its slice layer by layer, in chunks of
C; before a layer's chunks:
  window arms (orthros, swa): the shard's last min(W-1, Ls) slots are written first, then each
    shard receives the W-1 slots before it (kernels/collectives.halo; several hops when
    W-1 > Ls): the same bytes at any prompt length.
  transformer: every slot is written first, then the layer's K/V is all-gathered.
Memory per device: the cache shard, the slice's activations [b, Ls, D] and one chunk's
temporaries. The last layer only writes its K/V; then the last token (the orthros output stream
through every layer, or a single-stream arm's last token through the last layer, its hidden
state broadcast from the shard owning its slot) reads the shards split-K.

decode: the new token's K/V lands on the shard owning its slot; the window read (which may
straddle shards) and the global read are split-K partials merged across shards by log-sum-exp.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orthros_jax.config import ModelConfig
from orthros_jax.inference import drivers as fwd
from orthros_jax.inference.cache import KVCache, cache_shardings, kv_cache_dtype
from orthros_jax.inference.decode_loop import Decode
from orthros_jax.inference.drivers import Impl
from orthros_jax.layers.kind import Params
from orthros_jax.parallel.sequence import SEQ, SequenceAttention, sequence_size

__all__ = [
    "decode",
    "decode_jit",
    "decoder",
    "mesh_of",
    "prefill",
    "sequence_size",
    "slot_tokens",
    "specs",
]


def mesh_of(cache: KVCache) -> Mesh | None:
    """The mesh a cache from init_cache(..., mesh=) is split over, if its slots are split (a
    "sequence" axis > 1); None for any other cache (which runs the single-program drivers)."""
    for leaf in jax.tree.leaves(cache.states):
        sh = getattr(leaf, "sharding", None)
        if (
            isinstance(sh, NamedSharding)
            and isinstance(sh.mesh, Mesh)
            and sequence_size(sh.mesh) > 1
        ):
            return sh.mesh
    return None


def specs(
    cfg: ModelConfig, mesh: Mesh, batch: int, max_len: int, kv_dtype: str | None = None
) -> tuple[KVCache, Any]:
    """shard_map specs: the cache's (by the rules; kv_dtype: a quantized cache's) and the rows'
    mesh axes (or None)."""
    sh = cache_shardings(cfg, batch, max_len, mesh, kv_dtype)
    spec = jax.tree.map(lambda s: s.spec, sh)
    rows = spec.lengths[0] if len(spec.lengths) else None
    return spec, rows


def slot_tokens(
    tokens: np.ndarray, lengths: np.ndarray, held: np.ndarray, max_len: int
) -> np.ndarray:
    """Prompts on the cache's slot grid: [B, S] int32 holding row b's prompt token t at slot
    held[b] + t (zeros elsewhere). tokens [B, T] right-padded, lengths/held [B]."""
    out = np.zeros((tokens.shape[0], max_len), np.int32)
    rows, cols = np.nonzero(np.arange(tokens.shape[1])[None] < lengths[:, None])
    out[rows, held[rows] + cols] = tokens[rows, cols]
    return out


class ShardDriver(Protocol):
    """drivers.prefill or drivers.decode: (params, cache, tokens, per-row arg) -> (logits, cache)
    with slot_offset (this shard's first global slot) and the attention implementation."""

    def __call__(
        self,
        params: Params,
        cache: KVCache,
        tokens: jax.Array,
        per_row: jax.Array,
        /,
        *,
        cfg: ModelConfig,
        impl: Impl | None,
        slot_offset: jax.Array | None,
    ) -> tuple[jax.Array, KVCache]: ...


def _on_shards(
    driver: ShardDriver, cfg: ModelConfig, mesh: Mesh, cache: KVCache, tokens_spec: P, **kw: Any
) -> Any:
    """driver (drivers.prefill or drivers.decode) on each shard of `mesh`: fn(params, cache,
    tokens, per-row arg) -> (logits [B, V], cache split the same way). Each shard runs it on its
    slots (slot_offset: its first global slot) with sequence parallelism's attention."""
    cache_spec, rows = specs(cfg, mesh, cache.batch_size, cache.max_len, kv_cache_dtype(cache))

    def shard(params: Params, cache: KVCache, tokens: jax.Array, per_row: jax.Array) -> Any:
        ls = cache.max_len // sequence_size(mesh)
        off = jax.lax.axis_index(SEQ) * ls
        impl = SequenceAttention(cfg.attention_impl)
        local = cache.replace(max_len=ls)
        logits, local = driver(params, local, tokens, per_row, cfg=cfg, impl=impl, slot_offset=off)
        return logits, local.replace(max_len=cache.max_len)

    return jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(P(), cache_spec, P(rows, *tokens_spec), P(rows)),
        out_specs=(P(rows), cache_spec),
        **kw,
    )


@functools.partial(jax.jit, static_argnames=("cfg", "mesh"), donate_argnames=("cache",))
def prefill(
    params: Params,
    cache: KVCache,
    tokens: jax.Array,
    lengths: jax.Array,
    *,
    cfg: ModelConfig,
    mesh: Mesh,
) -> tuple[jax.Array, KVCache]:
    """drivers.prefill on a cache split over `mesh` (see the module docstring). tokens [B, S]:
    the prompts on the slot grid (`slot_tokens`), split like the cache's slots; lengths [B] >= 1.
    Returns (logits [B, V] at each prompt's last token, the cache split the same way)."""
    # A Pallas kernel's outputs carry no varying-axes types (splash's prefill chunks).
    check_vma = cfg.attention_impl != "splash"
    fn = _on_shards(fwd.prefill, cfg, mesh, cache, P(SEQ), check_vma=check_vma)
    return fn(params, cache, tokens, lengths)


def decode(
    params: Params,
    cache: KVCache,
    tokens: jax.Array,
    active: jax.Array,
    *,
    cfg: ModelConfig,
    mesh: Mesh,
) -> tuple[jax.Array, KVCache]:
    """drivers.decode on a cache split over `mesh` (traceable inside jit: generate's
    loop). tokens, active [B] -> (logits [B, V], cache split the same way)."""
    return _on_shards(fwd.decode, cfg, mesh, cache, P())(params, cache, tokens, active)


def decoder(cfg: ModelConfig, mesh: Mesh | None) -> Decode:
    """The decode of a cache split over mesh (None: one program, drivers.decode)."""
    if mesh is None:
        return functools.partial(fwd.decode, cfg=cfg)
    return functools.partial(decode, cfg=cfg, mesh=mesh)


decode_jit = jax.jit(decode, static_argnames=("cfg", "mesh"), donate_argnames=("cache",))
