"""How to attend: the seam between a layer's math and the attention kernels.

A layer step builds its queries and a `Keys` set (what they may read, with positions and
segment ids) and calls `attention_impls.attend(impl, ...)`. An implementation is any
`AttentionImpl` (a callable with attend's signature); the model's are chosen by name
(ModelConfig.attention_impl) from attention_impls.IMPLEMENTATIONS:
  xla          the blocked kernels of kernels/attention.py (sliding window O(T*w); causal
               blocked online softmax that skips invisible key blocks; a plain dot for a few
               queries per row).
  dot_product  `jax.nn.dot_product_attention` without `implementation=`, i.e. its XLA
               lowering on every backend (it never selects cuDNN by itself; the `cudnn`
               implementation asks for it). Aligned self-attention with default positions uses
               its own `is_causal` / `local_window_size=(w-1, 0)`; anything else gets an
               explicit mask built from positions and segment ids (its causal mask is aligned
               top-left, so a chunk attending prefix + chunk or a cache cannot use it).
  splash       jax's Pallas splash-attention kernels on TPU (splash.py; `interpret` on CPU):
               aligned self-attention and SFT's output copies; few queries and other cache reads
               as xla.
  cudnn        `jax.nn.dot_product_attention(implementation="cudnn")` (cudnn.py): bf16/fp16 on
               NVIDIA GPUs; an unsupported case is a ValueError, never another implementation.
This module holds the seam's types and the two XLA implementations; attention_impls.py the
table of every named one (splash and cudnn import this module, so the table sits above them).
Implementations that are not models live with what needs them and are passed as objects: the
benchmark's token-wise floor (benchmarks/common.py) and sequence parallelism's split-K merge
(parallel/sequence.py).
Every mask is "same segment, key position <= query position (and > query position - window)".
"""

from __future__ import annotations

from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.kernels import slots as slot_ops
from orthros_jax.kernels.attention import (
    global_attention,
    local_attention,
    visibility,
)
from orthros_jax.kernels.few_queries import few_query_attention, few_query_stacked

# A query count up to which a plain dot over the keys beats the blocked kernels.
FEW_QUERIES = 8


class Keys(flax.struct.PyTreeNode):
    """The keys and values a set of queries may read.

    k, v: [B, Lk, K, H], or [B, K, Lk, H] with head_major=True (a cache layer read in place);
    positions, segment_ids: [B, Lk]. aligned=True: key t belongs to query t (self-attention of a
    sequence or a prefill chunk; `prefix` then holds (k [B, P, K, H], v, positions [B, P],
    segment_ids [B, P]) of the keys right before, e.g. a chunk's window read from the cache).
    default_positions=True: positions are arange(Lk) in one segment (no packing), which lets
    `dot_product` use its built-in causal/window masks.
    q_index [B, Lq]: the queries are copies of these keys' tokens, at these array indices (SFT's
    output stream over the sequence; `splash` attends them at their tokens' places).
    split=True: these are only this shard's keys of a set split over a mesh axis (a
    sequence-sharded cache); only sequence parallelism's implementation combines the shards.
    stack (k, v, layer): head-major keys that are layer `layer` of these cache stacks
    [layers, B, K, S, H] (kernels/slots.py): xla's few-query read on CPU reads them block by
    block out of the stacks (kernels/few_queries.few_query_stacked) instead of k and v.
    """

    k: jax.Array
    v: jax.Array
    positions: jax.Array
    segment_ids: jax.Array
    prefix: tuple[jax.Array, jax.Array, jax.Array, jax.Array] | None = None
    q_index: jax.Array | None = None
    stack: tuple[Any, Any, Any] | None = None
    head_major: bool = flax.struct.field(pytree_node=False, default=False)
    aligned: bool = flax.struct.field(pytree_node=False, default=False)
    default_positions: bool = flax.struct.field(pytree_node=False, default=False)
    split: bool = flax.struct.field(pytree_node=False, default=False)

    def seq_major(self) -> tuple[jax.Array, jax.Array]:
        """(k, v) as [B, Lk, K, H]."""
        if self.head_major:
            return jnp.swapaxes(self.k, 1, 2), jnp.swapaxes(self.v, 1, 2)
        return self.k, self.v

    def head_major_kv(self) -> tuple[jax.Array, jax.Array]:
        """(k, v) as [B, K, Lk, H]."""
        if self.head_major:
            return self.k, self.v
        return jnp.swapaxes(self.k, 1, 2), jnp.swapaxes(self.v, 1, 2)

    def with_prefix(self) -> Keys:
        """The prefix keys concatenated in front (sequence-major); aligned is dropped."""
        if self.prefix is None:
            return self.replace(aligned=False)
        k, v = self.seq_major()
        pk, pv, ppos, pseg = self.prefix
        return Keys(
            jnp.concatenate([pk.astype(k.dtype), k], 1),
            jnp.concatenate([pv.astype(v.dtype), v], 1),
            jnp.concatenate([ppos, self.positions], 1),
            jnp.concatenate([pseg, self.segment_ids], 1),
        )


def few(
    q: jax.Array,
    q_pos: jax.Array,
    q_seg: jax.Array,
    keys: Keys,
    window: int | None,
    block_kib: int,
) -> jax.Array:
    """A plain dot over the keys for a few queries per row (decode, a prompt's last token). Keys
    read from a cache stack (keys.stack) are read block by block out of it on CPU (blocks of
    block_kib KiB, up to the last visible key: few_query_stacked); the whole layer elsewhere
    (TPU reads the slice in place; on GPU a block is copied out like the layer)."""
    keys = keys.with_prefix()
    mask = visibility(q_pos, q_seg, keys.positions, keys.segment_ids, window)
    whole = lambda: few_query_attention(q, *keys.head_major_kv(), mask)  # noqa: E731
    if keys.stack is None:
        return whole()
    k_stack, v_stack, layer = keys.stack
    block = slot_ops.block_slots(k_stack, block_kib)
    blocks = lambda: few_query_stacked(q, k_stack, v_stack, layer, mask, block)  # noqa: E731
    return jax.lax.platform_dependent(cpu=blocks, default=whole)


def xla(
    q: jax.Array,
    q_pos: jax.Array,
    q_seg: jax.Array,
    keys: Keys,
    window: int | None,
    cfg: ModelConfig,
) -> jax.Array:
    """The "xla" implementation: the blocked kernels of kernels/attention.py."""
    if keys.aligned and window is not None:
        k, v = keys.seq_major()
        return local_attention(
            q,
            k,
            v,
            q_positions=q_pos,
            k_positions=keys.positions,
            window=window,
            q_segment_ids=q_seg,
            k_segment_ids=keys.segment_ids,
            prefix=keys.prefix,
            block_size=cfg.attention_block_local,
        )
    if q.shape[1] <= FEW_QUERIES:
        return few(q, q_pos, q_seg, keys, window, cfg.attention_block_cache_kib)
    if window is not None:
        raise ValueError(
            f"window attention of {q.shape[1]} queries needs keys aligned with them "
            "(a sequence or a prefill chunk)"
        )
    keys = keys.with_prefix()
    return global_attention(
        q,
        keys.k,
        keys.v,
        q_positions=q_pos,
        k_positions=keys.positions,
        q_segment_ids=q_seg,
        k_segment_ids=keys.segment_ids,
        block_q=cfg.attention_block_q,
        block_k=cfg.attention_block_k,
        kv_head_major=keys.head_major,
    )


def dot_product(
    q: jax.Array,
    q_pos: jax.Array,
    q_seg: jax.Array,
    keys: Keys,
    window: int | None,
    cfg: ModelConfig,
) -> jax.Array:
    """The "dot_product" implementation: jax.nn.dot_product_attention's XLA lowering."""
    if keys.aligned and keys.default_positions and keys.prefix is None:
        k, v = keys.seq_major()
        local = None if window is None else (window - 1, 0)
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local)
        return out.astype(q.dtype)
    full = keys.with_prefix()
    k, v = full.seq_major()
    mask = visibility(q_pos, q_seg, full.positions, full.segment_ids, window)
    out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask[:, None])
    # A query with no visible key (padding) gets a uniform average: finite garbage, as in xla.
    return out.astype(q.dtype)


class AttentionImpl(Protocol):
    """How a set of queries attends a set of keys (see attention_impls.attend)."""

    def __call__(
        self,
        q: jax.Array,
        q_pos: jax.Array,
        q_seg: jax.Array,
        keys: Keys,
        window: int | None,
        cfg: ModelConfig,
    ) -> jax.Array: ...
