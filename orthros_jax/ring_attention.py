"""Ring attention: the Transformer arm's other sequence-parallel baseline (inside shard_map).

Each shard keeps its queries and passes its K/V chunk around the ring of the `axis_name`
shards with `lax.ppermute` (P - 1 hops of one chunk: O(T) bytes per shard in all, like an
all-gather, but only two chunks in memory at a time). Every chunk is attended by
attention.py's blocked kernel (`attend_key_blocks`), its online-softmax state carried across
the ring steps; key blocks that no query of a block can see (a later shard's chunk under the
causal mask) are skipped. Masks come from positions and segment ids, as in attention.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthros_jax.attention import (
    attend_key_blocks,
    block_keys,
    block_kinds,
    block_queries,
    finish_blocks,
    softmax_state,
)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def ring_causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_positions: jax.Array,
    k_positions: jax.Array,
    q_segment_ids: jax.Array | None = None,
    k_segment_ids: jax.Array | None = None,
    *,
    axis_name: str,
    block_q: int = 512,
    block_k: int = 512,
) -> jax.Array:
    """Causal attention of this shard's queries over the keys of every shard, by a K/V ring.

    q: [B, Ls, N, H]; k, v: [B, Ls, K, H]; positions/segment ids [B, Ls] (segments default 1;
    KEY_PAD_SEGMENT / QUERY_PAD_SEGMENT mark padding). Equals attention.global_attention on
    the unsplit arrays. Returns [B, Ls, N, H] in q's dtype.
    """
    bsz, ls, n, h = q.shape
    kv = k.shape[2]
    if k.shape != (bsz, ls, kv, h) or v.shape != k.shape or n % kv:
        raise ValueError(
            f"ring_causal_attention: q {q.shape}, k {k.shape}, v {v.shape}: k and v must be "
            f"[B={bsz}, Ls={ls}, K, H={h}] with K dividing N={n}"
        )
    for name, value in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"ring_causal_attention: {name} must be a positive int, got {value!r}")
    n_dev = jax.lax.axis_size(axis_name)
    ones = jnp.ones((bsz, ls), jnp.int32)
    q_seg = ones if q_segment_ids is None else jnp.asarray(q_segment_ids, jnp.int32)
    k_seg = ones if k_segment_ids is None else jnp.asarray(k_segment_ids, jnp.int32)
    queries = block_queries(q, q_positions, q_seg, kv, min(block_q, _round_up(ls, 8)))
    # The travelling chunk: this shard's keys, blocked.
    chunk = block_keys(
        jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), k_positions, k_seg,
        min(block_k, _round_up(ls, 8)),
    )  # fmt: skip

    def attend_chunk(state, chunk):
        kind = block_kinds(queries, chunk)  # [nq, nk]

        def one_query_block(args):
            q_i, pos_i, seg_i, kind_i, *carried = args
            return attend_key_blocks(tuple(carried), q_i, pos_i, seg_i, kind_i, chunk)

        return jax.lax.map(one_query_block, (*queries, kind, *state))

    ring = [(i, (i + 1) % n_dev) for i in range(n_dev)]

    def step(_, carry):
        state, chunk = carry
        return attend_chunk(state, chunk), jax.lax.ppermute(chunk, axis_name, ring)

    state = softmax_state(queries.q)
    if n_dev > 1:
        state, chunk = jax.lax.fori_loop(0, n_dev - 1, step, (state, chunk))
    acc, _, total = attend_chunk(state, chunk)  # the last chunk needs no further hop
    return finish_blocks(acc, total, n, ls).astype(q.dtype)
