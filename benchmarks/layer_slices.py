"""The per-layer K/V copy of a stacked cache, isolated (decode_profile.py's suite 'slices'):
the attention of a few queries over one layer of a cache, the layer read four ways (Read).

  stacked_index   out of a stacked [layers, B, K, S, H] cache by a traced layer index, inside
                  a fori_loop (as layers/stack.layer_loop reads the cached modes' layers)
  stacked_static  out of the same stack by static indices (the loop unrolled)
  stacked_blocks  out of the same stack block by block by a traced index (the library's CPU
                  read, kernels/few_queries.few_query_stacked, `block` slots a block)
  per_layer       from separate [B, K, S, H] buffers, one per layer (the loop unrolled)

Each call runs `reads` such attentions, the next query fed by the last output (nothing hoisted
or merged). XLA:CPU copies the slice of a stack (a layer, or a block of one) out before a dot
reads it; the per-layer buffers are read in place. `aot_row` compiles the stacked read for
an accelerator target.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import common as bench
from benchmarks import hlo_profile
from benchmarks.hlo_profile import Part
from orthros_jax.config import ModelConfig
from orthros_jax.kernels import slots as slot_ops
from orthros_jax.kernels.few_queries import few_query_attention, few_query_stacked


class Read(enum.Enum):
    """How a layer's K/V is read (module docstring)."""

    STACKED_INDEX = "stacked_index"
    STACKED_STATIC = "stacked_static"
    STACKED_BLOCKS = "stacked_blocks"
    PER_LAYER = "per_layer"

    @property
    def stacked(self) -> bool:
        return self is not Read.PER_LAYER


@dataclasses.dataclass(frozen=True)
class ReadShape:
    """The cache read: layers, rows, kv heads, slots S, head dim H, query heads N."""

    layers: int
    batch: int
    kv_heads: int
    slots: int
    head_dim: int
    heads: int
    block: int  # the blocked read's block bound (few_query_stacked tiles S with at most this)

    @classmethod
    def of(cls, cfg: ModelConfig, batch: int, slots: int) -> ReadShape:
        """A model's attention shape at `batch` rows and `slots` slots."""
        stack = jax.ShapeDtypeStruct(
            (cfg.n_layers, batch, cfg.n_kv_heads, slots, cfg.head_dim), jnp.float32
        )
        block = min(slot_ops.block_slots(stack, cfg.attention_block_cache_kib), slots)
        return cls(cfg.n_layers, batch, cfg.n_kv_heads, slots, cfg.head_dim, cfg.n_heads, block)

    @property
    def stack(self) -> tuple[int, ...]:
        """Dims of the stacked K (or V): [layers, B, K, S, H]."""
        return (self.layers, self.batch, self.kv_heads, self.slots, self.head_dim)


def read_layers(read: Read, reads: int, layers: int, block: int) -> Any:
    """A jitted fn(k, v, q [B, Q, N, H], visible [B, Q, S]) -> [B, Q, N, H] running `reads`
    attentions over one layer each, read the `read` way (module docstring): k, v are
    [layers, B, K, S, H] stacks, or for PER_LAYER lists of [B, K, S, H]."""

    def run(kc: Any, vc: Any, q: jax.Array, vis: jax.Array) -> jax.Array:
        if read in (Read.STACKED_INDEX, Read.STACKED_BLOCKS):

            def body(i: jax.Array, acc: jax.Array) -> jax.Array:
                if read is Read.STACKED_BLOCKS:
                    return acc + few_query_stacked(q + acc, kc, vc, i % layers, vis, block)
                k = jax.lax.dynamic_index_in_dim(kc, i % layers, 0, keepdims=False)
                v = jax.lax.dynamic_index_in_dim(vc, i % layers, 0, keepdims=False)
                return acc + few_query_attention(q + acc, k, v, vis)

            return jax.lax.fori_loop(0, reads, body, jnp.zeros_like(q))
        acc = jnp.zeros_like(q)
        for i in range(reads):
            acc = acc + few_query_attention(q + acc, kc[i % layers], vc[i % layers], vis)
        return acc

    return jax.jit(run)


def read_args(shape: ReadShape, queries: int, stacked: bool) -> tuple:
    """Random float32 (k, v, q, visible) for read_layers: every slot but the last 100 visible."""
    kc = jax.random.normal(jax.random.PRNGKey(0), shape.stack)
    vc = 0.5 * kc
    q_shape = (shape.batch, queries, shape.heads, shape.head_dim)
    q = jax.random.normal(jax.random.PRNGKey(1), q_shape)
    vis = jnp.arange(shape.slots)[None, None] < jnp.full(
        (shape.batch, queries, 1), shape.slots - 100
    )
    if stacked:
        return kc, vc, q, vis
    return list(kc), list(vc), q, vis


def copies(compiled: Any, shape: ReadShape) -> tuple[int, int]:
    """(whole layers, parts of a layer) that a compiled read's top-level instructions copy out
    of the stack (hlo_profile's kv_copy and kv_block)."""
    module = hlo_profile.Module.of(compiled)
    parts = hlo_profile.classify(module, {shape.stack}, set(), {shape.slots})
    count = collections.Counter(parts.values())
    return count[Part.KV_COPY], count[Part.KV_BLOCK]


def ab_row(shape: ReadShape, queries: int, reads: int, repeats: int) -> dict[str, Any]:
    """Every Read compiled and timed interleaved: per variant the layer and block copies in its
    HLO, its temporary MiB and ms per layer read; each stacked one over per_layer (the median
    of the per-round ratios)."""
    row: dict[str, Any] = {"slots": shape.slots, "queries": queries, "batch": shape.batch}
    calls: dict[str, Callable[[], Any]] = {}
    for read in Read:
        args = read_args(shape, queries, read.stacked)
        compiled = read_layers(read, reads, shape.layers, shape.block).lower(*args).compile()
        row[f"{read.value}_copies"], row[f"{read.value}_block_copies"] = copies(compiled, shape)
        row[f"{read.value}_temp_mib"] = compiled.memory_analysis().temp_size_in_bytes / 2**20
        calls[read.value] = functools.partial(compiled, *args)
    timing = bench.time_interleaved(calls, repeats)
    for read in Read:
        row[f"{read.value}_ms"] = timing[read.value]["median_s"] * 1e3 / reads
    for read in Read:
        if read.stacked:
            over = bench.ratio(timing[read.value], timing[Read.PER_LAYER.value])
            row[f"{read.value}_over_per_layer"] = over
    return row


def aot_row(shape: ReadShape, target: str) -> dict[str, Any]:
    """The stacked read (traced index, one query, bfloat16) compiled for `target`
    (benchmarks/aot.target_devices), nothing run: the layer-slice copies left in its HLO and
    its temporary bytes over one layer's K (or V)."""
    from benchmarks.aot import target_devices

    try:
        sharding = jax.sharding.SingleDeviceSharding(target_devices(target)[0])
    except jax.errors.JaxRuntimeError as e:  # e.g. libtpu held by another process: say so
        return {"target": target, "slots": shape.slots, "error": str(e).splitlines()[0]}
    bf16 = lambda *dims: jax.ShapeDtypeStruct(dims, jnp.bfloat16, sharding=sharding)  # noqa: E731
    q = bf16(shape.batch, 1, shape.heads, shape.head_dim)
    vis = jax.ShapeDtypeStruct((shape.batch, 1, shape.slots), jnp.bool_, sharding=sharding)
    fn = read_layers(Read.STACKED_INDEX, shape.layers, shape.layers, shape.block)
    compiled = fn.lower(bf16(*shape.stack), bf16(*shape.stack), q, vis).compile()
    layer_k = 2 * shape.batch * shape.kv_heads * shape.slots * shape.head_dim
    temp = compiled.memory_analysis().temp_size_in_bytes
    return {
        "target": target,
        "slots": shape.slots,
        "kv_copies": copies(compiled, shape)[0],
        "temp_mib": temp / 2**20,
        "temp_over_layer_k": temp / layer_k,
    }
