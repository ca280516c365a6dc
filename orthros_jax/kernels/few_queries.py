"""Attention of a few queries per row over many keys: a decode step, a verify pass's copies, a
prompt's last token, a window read from a cache.

Shapes: B rows, Q queries per row, N query heads, K kv heads (G = N / K per kv head), S keys,
H head dim. Keys are head-major ([B, K, S, H]: a cache layer read as it is stored). Scores and
softmax in float32; a key a query may not see weighs exactly 0.

  few_query_partial    the unnormalised attention with its max and sum (shards or blocks of a
                       key set combine by log-sum-exp)
  few_query_attention  the attention over all the keys at once
  few_query_stacked    the attention over one layer of cache stacks, block by block
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from orthros_jax.kernels import slots as slot_ops

MASKED = -1e30  # finite, so rows with no visible key stay finite (and are sliced away)


def few_query_partial(
    q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unnormalised attention of a few queries per row over head-major keys, with its
    statistics: q [B, Q, N, H]; k, v [B, K, S, H]; visible [B, Q, S] bool. Returns float32
    acc [B, Q, N, H] = sum_j p_j v_j with p_j = exp(s_j - max), max and sum [B, Q, N]; invisible
    keys weigh exactly 0 (a query that sees nothing has acc = sum = 0, max = -1e30), so shards
    of a key set combine by log-sum-exp (sequence_parallel.merge_partials)."""
    bsz, nq, n, h = q.shape
    kv = k.shape[1]
    qg = q.reshape(bsz, nq, kv, n // kv, h)
    s = jnp.einsum("bqkgh,bksh->bkgqs", qg, k, preferred_element_type=jnp.float32)
    mask = visible[:, None, None]
    s = jnp.where(mask, s / math.sqrt(h), MASKED)
    m = s.max(axis=-1)
    p = jnp.where(mask, jnp.exp(s - m[..., None]), 0.0)
    # [B, K, G, Q, H] then transposed (small): XLA:CPU has no bf16 x bf16 -> f32 dot for the
    # "bqkgh" output order.
    acc = jnp.einsum("bkgqs,bksh->bkgqh", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    to_bqn = lambda a: jnp.moveaxis(a, 3, 1).reshape(bsz, nq, n, *a.shape[4:])
    return to_bqn(acc), to_bqn(m), to_bqn(p.sum(axis=-1))


def few_query_attention(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
    """A few queries per row over head-major keys (decode, a prompt's last token, a window read
    from a cache): q [B, Q, N, H]; k, v [B, K, S, H]; visible [B, Q, S] bool.
    Returns [B, Q, N, H] in q's dtype (0 for a query that sees no key). Softmax in float32."""
    acc, _, total = few_query_partial(q, k, v, visible)
    return (acc / jnp.where(total > 0, total, 1.0)[..., None]).astype(q.dtype)


def few_query_stacked(
    q: jax.Array,
    k_stack: Any,
    v_stack: Any,
    layer: jax.Array | int,
    visible: jax.Array,
    block: int,
) -> jax.Array:
    """few_query_attention over layer `layer` of cache stacks [layers, B, K, S, H] (or
    slots.QuantKV), read block by block straight out of the stacks: q [B, Q, N, H]; visible
    [B, Q, S] bool. Only the blocks up to the last key any query sees are visited (a
    fori_loop with a traced trip count: a cache's filled extent, not its size), each block's
    partial merged by log-sum-exp. Why: an XLA:CPU dot cannot read a slice of a buffer in
    place, so few_query_attention over the whole layer copies it out first (a second pass over
    the cache; docs/performance.md). Returns [B, Q, N, H] in q's dtype."""
    bsz, nq, n, h = q.shape
    s = visible.shape[-1]
    # Equal blocks of at most `block` slots that tile S: the last block, clamped to end at S,
    # re-reads fewer slots than there are blocks.
    most = -(-s // min(block, s))
    blk = -(-s // most)
    extent = jnp.max(jnp.where(visible, jnp.arange(1, s + 1), 0))
    n_blocks = (extent + blk - 1) // blk

    def visit(i: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        acc, m, total = carry
        start = jnp.minimum(i * blk, s - blk)  # the last block ends at S; its overlap is masked
        k = slot_ops.layer_block(k_stack, layer, start, blk)
        v = slot_ops.layer_block(v_stack, layer, start, blk)
        fresh = start + jnp.arange(blk) >= i * blk
        vis = jax.lax.dynamic_slice_in_dim(visible, start, blk, axis=2) & fresh
        acc_b, m_b, total_b = few_query_partial(q, k, v, vis)
        m_new = jnp.maximum(m, m_b)
        old, new = jnp.exp(m - m_new), jnp.exp(m_b - m_new)
        return acc * old[..., None] + acc_b * new[..., None], m_new, total * old + total_b * new

    init = (
        jnp.zeros((bsz, nq, n, h), jnp.float32),
        jnp.full((bsz, nq, n), MASKED, jnp.float32),
        jnp.zeros((bsz, nq, n), jnp.float32),
    )
    acc, _, total = jax.lax.fori_loop(0, n_blocks, visit, init)
    return (acc / jnp.where(total > 0, total, 1.0)[..., None]).astype(q.dtype)
