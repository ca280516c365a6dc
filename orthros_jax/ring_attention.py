"""Ring attention: the Transformer arm's other sequence-parallel baseline (inside shard_map).

Each shard keeps its queries and passes its K/V chunk around the ring of the `axis_name`
shards with `lax.ppermute` (P - 1 hops of one chunk: O(T) bytes per shard in all, like an
all-gather, but only two chunks in memory at a time). Every chunk is attended blocked, with an
online softmax carried across the ring steps, and key blocks that no query of a block can see
(a later shard's chunk under the causal mask) are skipped. Masks come from positions and
segment ids, as in attention.py.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from orthros_jax.attention import KEY_PAD_SEGMENT, QUERY_PAD_SEGMENT
from orthros_jax.sequence_parallel import FAR_POSITION

_BIG = jnp.iinfo(jnp.int32).max
_MASKED = -1e30  # finite, as in attention.py
F32 = jnp.float32


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _pad_blocks(x: jax.Array, axis: int, size: int, value) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _ranges(pos: jax.Array, seg: jax.Array, pad_seg: int) -> tuple[jax.Array, ...]:
    """Per block [B, nb, b] -> (pos min, pos max, seg min, seg max) [B, nb] over valid entries."""
    ok = seg != pad_seg
    return (
        jnp.min(jnp.where(ok, pos, _BIG), axis=2),
        jnp.max(jnp.where(ok, pos, -_BIG), axis=2),
        jnp.min(jnp.where(ok, seg, _BIG), axis=2),
        jnp.max(jnp.where(ok, seg, -_BIG), axis=2),
    )


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
    g = n // kv
    n_dev = jax.lax.axis_size(axis_name)
    bq, bk = min(block_q, _round_up(ls, 8)), min(block_k, _round_up(ls, 8))
    lq, lk = _round_up(ls, bq), _round_up(ls, bk)
    nq, nk = lq // bq, lk // bk

    ones = jnp.ones((bsz, ls), jnp.int32)
    q_seg = ones if q_segment_ids is None else jnp.asarray(q_segment_ids, jnp.int32)
    k_seg = ones if k_segment_ids is None else jnp.asarray(k_segment_ids, jnp.int32)
    # Queries head-major with the G heads of a kv head folded into the rows, [nq, B, K, G*bq, H]
    # (one plain matmul per block pair), with positions/segments [nq, B, bq].
    qb = _pad_blocks(q, 1, lq, 0).reshape(bsz, nq, bq, kv, g, h)
    qb = qb.transpose(1, 0, 3, 4, 2, 5).reshape(nq, bsz, kv, g * bq, h)
    qpos = _pad_blocks(jnp.asarray(q_positions, jnp.int32), 1, lq, -1).reshape(bsz, nq, bq)
    qseg = _pad_blocks(q_seg, 1, lq, QUERY_PAD_SEGMENT).reshape(bsz, nq, bq)
    q_lo, q_hi, qs_lo, qs_hi = (r[:, :, None] for r in _ranges(qpos, qseg, QUERY_PAD_SEGMENT))
    qpos, qseg = qpos.swapaxes(0, 1), qseg.swapaxes(0, 1)
    # The travelling chunk: head-major K/V [B, K, nk, bk, H], positions/segments [B, nk, bk].
    chunk = (
        _pad_blocks(k, 1, lk, 0).swapaxes(1, 2).reshape(bsz, kv, nk, bk, h),
        _pad_blocks(v, 1, lk, 0).swapaxes(1, 2).reshape(bsz, kv, nk, bk, h),
        _pad_blocks(jnp.asarray(k_positions, jnp.int32), 1, lk, FAR_POSITION).reshape(bsz, nk, bk),
        _pad_blocks(k_seg, 1, lk, KEY_PAD_SEGMENT).reshape(bsz, nk, bk),
    )
    # Online-softmax state of every query block; built from the queries (*_like) so that under
    # shard_map it varies over the same mesh axes as what the loop computes from them.
    acc0 = jnp.zeros_like(qb, jnp.float32)
    state = (acc0, jnp.full_like(acc0[..., 0], _MASKED), jnp.zeros_like(acc0[..., 0]))
    scale = 1.0 / math.sqrt(h)

    def attend_chunk(state, chunk):
        kc, vc, kpos, kseg = chunk
        k_lo, k_hi, ks_lo, ks_hi = (r[:, None] for r in _ranges(kpos, kseg, KEY_PAD_SEGMENT))
        # Per (query block, key block), over the batch: 0 = no query sees a key (skipped),
        # 1 = some do (masked), 2 = every query sees every key (no mask). Conservative.
        some = (k_lo <= q_hi) & (ks_lo <= qs_hi) & (ks_hi >= qs_lo)
        every = (k_hi <= q_lo) & (ks_lo == ks_hi) & (qs_lo == qs_hi) & (ks_lo == qs_lo)
        every &= (kseg != KEY_PAD_SEGMENT).all(axis=2)[:, None]
        kind = jnp.where(every.all(axis=0), 2, jnp.where(some.any(axis=0), 1, 0))  # [nq, nk]

        def one_query_block(args):
            q_i, qpos_i, qseg_i, kind_i, *carried = args

            def attend(carry, j, masked: bool):
                acc, m, total = carry
                s = jnp.einsum("bkxh,bkyh->bkxy", q_i, kc[:, :, j], preferred_element_type=F32)
                s = s * scale
                if masked:
                    vis = (kpos[:, j][:, None, :] <= qpos_i[:, :, None]) & (
                        kseg[:, j][:, None, :] == qseg_i[:, :, None]
                    )  # [B, bq, bk]; rows of s are (G, bq)
                    s = jnp.where(vis[:, None, None], s.reshape(bsz, kv, g, bq, bk), _MASKED)
                    s = s.reshape(bsz, kv, g * bq, bk)
                # A row that has seen only masked scores has m = -1e30 and sums garbage with
                # weight 1; the first visible key rescales it by exp(-1e30 - m) = 0.
                m_new = jnp.maximum(m, s.max(axis=-1))
                p = jnp.exp(s - m_new[..., None])
                corr = jnp.exp(m - m_new)
                pv = jnp.einsum("bkxy,bkyh->bkxh", p.astype(vc.dtype), vc[:, :, j],
                                preferred_element_type=F32)  # fmt: skip
                return acc * corr[..., None] + pv, m_new, total * corr + p.sum(axis=-1)

            def visit(carry, j):
                branches = [
                    lambda c: c,
                    lambda c: attend(c, j, masked=True),
                    lambda c: attend(c, j, masked=False),
                ]
                return jax.lax.switch(kind_i[j], branches, carry), None

            return jax.lax.scan(visit, tuple(carried), jnp.arange(nk))[0]

        return jax.lax.map(one_query_block, (qb, qpos, qseg, kind, *state))

    ring = [(i, (i + 1) % n_dev) for i in range(n_dev)]

    def step(_, carry):
        state, chunk = carry
        state = attend_chunk(state, chunk)
        return state, jax.lax.ppermute(chunk, axis_name, ring)

    if n_dev > 1:
        state, chunk = jax.lax.fori_loop(0, n_dev - 1, step, (state, chunk))
    acc, _, total = attend_chunk(state, chunk)  # the last chunk needs no further hop
    out = (acc / jnp.where(total > 0, total, 1.0)[..., None]).reshape(nq, bsz, kv, g, bq, h)
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(bsz, lq, n, h)
    return out[:, :ls].astype(q.dtype)
