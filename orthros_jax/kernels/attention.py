"""Attention math, parameter-free. Every mask is derived from positions and segment ids.

Layout: q [B, Lq, N, H]; k, v [B, Lk, K, H] with N = K * G (grouped-query attention).
A key j is visible to a query i when seg[j] == seg[i] (packed documents never mix) and
  local  (sliding window): pos[i] - window < pos[j] <= pos[i]   (w keys, itself included)
  global (causal):                         pos[j] <= pos[i]
Padding uses segment ids that match nothing (keys -1, queries -2), so a padded row is finite
garbage that callers slice away. Scores and softmax are float32 whatever the input dtype.

`local_attention` never builds an Lq x Lk array: queries are cut into blocks of b keys and
block i reads key blocks i-nb+1..i (nb = 1 + ceil((w-1)/b), i.e. 2 when b = w), so time and
memory are O(T * w). `global_attention` is blocked over queries and keys with an online
softmax and skips key blocks that no query of the block can see, so memory is
O(block_q * block_k) per step; with a single query per row it is one dot over the keys
(few_queries.py: a few queries per row, e.g. decode and its cache reads).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from orthros_jax.kernels.few_queries import MASKED as _MASKED
from orthros_jax.kernels.few_queries import few_query_attention

# A key position no query reaches (padding keys; a halo before the sequence start).
PAD_POSITION = jnp.iinfo(jnp.int32).max // 2
KEY_PAD_SEGMENT = -1
QUERY_PAD_SEGMENT = -2


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _pad_axis1(x: jax.Array, length: int, value: Any, front: bool = False) -> jax.Array:
    pad = length - x.shape[1]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (pad, 0) if front else (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def _default_segments(segment_ids: jax.Array | None, like: jax.Array) -> jax.Array:
    if segment_ids is None:
        return jnp.ones(like.shape[:2], jnp.int32)
    return jnp.asarray(segment_ids, jnp.int32)


def local_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    q_positions: jax.Array,
    k_positions: jax.Array,
    window: int,
    q_segment_ids: jax.Array | None = None,
    k_segment_ids: jax.Array | None = None,
    prefix: tuple[jax.Array, jax.Array, jax.Array, jax.Array] | None = None,
    block_size: int | None = None,
) -> jax.Array:
    """Sliding-window self-attention, O(T * w) time and memory.

    q: [B, T, N, H]; k, v: [B, T, K, H], aligned with q (array index t of k is the key of the
    token whose query is q[:, t]); positions/segment ids: [B, T].
    prefix: optional (k [B, P, K, H], v, positions [B, P], segment_ids [B, P]) of keys that come
      right before the T tokens (a chunk's previous window read from a KV cache); only its last
      `window - 1` entries can be visible.
    Contract: inside a segment positions rise by at least one per index (checked with a
    ValueError when positions are concrete; see `check_positions_contract`).
    Returns [B, T, N, H] in q's dtype.
    """
    check_positions_contract(q_positions, q_segment_ids)
    bsz, t, n, h = q.shape
    kv = k.shape[2]
    g = n // kv
    b = min(block_size or window, window, _round_up(t, 8))
    t_pad = _round_up(t, b)
    nq = t_pad // b
    nb = 1 + -(-(window - 1) // b)  # key blocks per query block, its own included
    if prefix is None:
        nb = min(nb, nq)  # blocks before the start would be all padding
    p_len = (nb - 1) * b

    q_seg = _default_segments(q_segment_ids, q)
    k_seg = _default_segments(k_segment_ids, k)
    q = _pad_axis1(q, t_pad, 0)
    q_pos = _pad_axis1(jnp.asarray(q_positions, jnp.int32), t_pad, 0)
    q_seg = _pad_axis1(q_seg, t_pad, QUERY_PAD_SEGMENT)
    k_pos = _pad_axis1(jnp.asarray(k_positions, jnp.int32), t_pad, PAD_POSITION)
    k_seg = _pad_axis1(k_seg, t_pad, KEY_PAD_SEGMENT)
    k = _pad_axis1(k, t_pad, 0)
    v = _pad_axis1(v, t_pad, 0)

    if p_len:
        if prefix is None:
            pk = jnp.zeros((bsz, p_len, kv, h), k.dtype)
            pv = jnp.zeros((bsz, p_len, kv, h), v.dtype)
            ppos = jnp.full((bsz, p_len), PAD_POSITION, jnp.int32)
            pseg = jnp.full((bsz, p_len), KEY_PAD_SEGMENT, jnp.int32)
        else:
            pk, pv, ppos, pseg = prefix
            pk, pv = pk[:, -p_len:], pv[:, -p_len:]
            ppos, pseg = ppos[:, -p_len:].astype(jnp.int32), pseg[:, -p_len:].astype(jnp.int32)
            pk = _pad_axis1(pk.astype(k.dtype), p_len, 0, front=True)
            pv = _pad_axis1(pv.astype(v.dtype), p_len, 0, front=True)
            ppos = _pad_axis1(ppos, p_len, PAD_POSITION, front=True)
            pseg = _pad_axis1(pseg, p_len, KEY_PAD_SEGMENT, front=True)
        k = jnp.concatenate([pk, k], axis=1)
        v = jnp.concatenate([pv, v], axis=1)
        k_pos = jnp.concatenate([ppos, k_pos], axis=1)
        k_seg = jnp.concatenate([pseg, k_seg], axis=1)

    # Head-major with the G query heads of a kv head folded into the rows: each block is one
    # [G*b, H] x [H, nb*b] matmul against its key window, with no transposes inside.
    n_ext = nq + nb - 1
    qb = q.reshape(bsz, nq, b, kv, g, h).transpose(0, 3, 1, 4, 2, 5).reshape(bsz, kv, nq, g * b, h)
    kt = k.reshape(bsz, n_ext, b, kv, h).transpose(0, 3, 1, 2, 4)  # [B, K, n_ext, b, H]
    vt = v.reshape(bsz, n_ext, b, kv, h).transpose(0, 3, 1, 2, 4)

    def windows(x: jax.Array, axis: int) -> jax.Array:
        # Query block i reads key blocks i..i+nb-1 of the prefixed array (original i-nb+1..i).
        sl = [jax.lax.slice_in_dim(x, j, j + nq, axis=axis) for j in range(nb)]
        return jnp.concatenate(sl, axis=axis + 1)

    kw = windows(kt, 2)  # [B, K, nq, nb*b, H]
    vw = windows(vt, 2)
    kpos_w = windows(k_pos.reshape(bsz, n_ext, b), 1)  # [B, nq, nb*b]
    kseg_w = windows(k_seg.reshape(bsz, n_ext, b), 1)
    # The one mask rule, each query block against its key window as a row of its own.
    visible = visibility(
        q_pos.reshape(bsz * nq, b),
        q_seg.reshape(bsz * nq, b),
        kpos_w.reshape(bsz * nq, nb * b),
        kseg_w.reshape(bsz * nq, nb * b),
        window,
    ).reshape(bsz, nq, b, nb * b)
    scale = 1.0 / math.sqrt(h)
    s = jnp.einsum("bkqxh,bkqyh->bkqxy", qb, kw, preferred_element_type=jnp.float32)
    s = s.reshape(bsz, kv, nq, g, b, nb * b) * scale
    s = jnp.where(visible[:, None, :, None], s, _MASKED)
    e = jnp.exp(s - s.max(axis=-1, keepdims=True))
    # Normalise after PV: one pass over [.., H] instead of one over the scores.
    o = (
        jnp.einsum(
            "bkqgxy,bkqyh->bkqgxh", e.astype(v.dtype), vw, preferred_element_type=jnp.float32
        )
        / e.sum(axis=-1)[..., None]
    )
    o = o.transpose(0, 2, 4, 1, 3, 5).reshape(bsz, t_pad, n, h)
    return o[:, :t].astype(q.dtype)


class QueryBlocks(NamedTuple):
    """Queries cut into blocks: q [nq, B, K, G*bq, H] (head-major, the G query heads of a kv
    head folded into the rows, so each block pair is one plain matmul); positions and segment
    ids [nq, B, bq] (padding rows: position -1, QUERY_PAD_SEGMENT)."""

    q: jax.Array
    pos: jax.Array
    seg: jax.Array


class KeyBlocks(NamedTuple):
    """Keys cut into blocks: k, v [B, K, nk, bk, H]; positions, segments [B, nk, bk]."""

    k: jax.Array
    v: jax.Array
    pos: jax.Array
    seg: jax.Array


def _block_queries(q: jax.Array, pos: jax.Array, seg: jax.Array, kv: int, bq: int) -> QueryBlocks:
    """q [B, Lq, N, H] with positions/segments [B, Lq] and kv key heads -> blocks of bq rows."""
    bsz, lq, n, h = q.shape
    lq_pad = _round_up(lq, bq)
    nq = lq_pad // bq
    qb = _pad_axis1(q, lq_pad, 0).reshape(bsz, nq, bq, kv, n // kv, h)
    qb = qb.transpose(1, 0, 3, 4, 2, 5).reshape(nq, bsz, kv, n // kv * bq, h)
    pos_b = _pad_axis1(jnp.asarray(pos, jnp.int32), lq_pad, -1).reshape(bsz, nq, bq)
    seg_b = _pad_axis1(seg, lq_pad, QUERY_PAD_SEGMENT).reshape(bsz, nq, bq)
    return QueryBlocks(qb, jnp.moveaxis(pos_b, 1, 0), jnp.moveaxis(seg_b, 1, 0))


def _block_keys(k: jax.Array, v: jax.Array, pos: jax.Array, seg: jax.Array, bk: int) -> KeyBlocks:
    """Head-major k, v [B, K, Lk, H] with positions/segments [B, Lk] -> blocks of bk keys (a
    free reshape when bk divides Lk: a head-major cache is read in place)."""
    bsz, kv, lk, h = k.shape
    lk_pad = _round_up(lk, bk)
    nk = lk_pad // bk
    pad = [(0, 0), (0, 0), (0, lk_pad - lk), (0, 0)]
    return KeyBlocks(
        jnp.pad(k, pad).reshape(bsz, kv, nk, bk, h),
        jnp.pad(v, pad).reshape(bsz, kv, nk, bk, h),
        _pad_axis1(jnp.asarray(pos, jnp.int32), lk_pad, PAD_POSITION).reshape(bsz, nk, bk),
        _pad_axis1(seg, lk_pad, KEY_PAD_SEGMENT).reshape(bsz, nk, bk),
    )


def _ranges(pos: jax.Array, seg: jax.Array, pad_seg: int) -> tuple[jax.Array, ...]:
    """Per block [.., b] -> (pos min, pos max, seg min, seg max) [..] over valid entries."""
    ok = seg != pad_seg
    big = jnp.iinfo(jnp.int32).max
    return (
        jnp.min(jnp.where(ok, pos, big), axis=-1),
        jnp.max(jnp.where(ok, pos, -big), axis=-1),
        jnp.min(jnp.where(ok, seg, big), axis=-1),
        jnp.max(jnp.where(ok, seg, -big), axis=-1),
    )


def _block_kinds(queries: QueryBlocks, keys: KeyBlocks) -> jax.Array:
    """Per (query block, key block), over the batch: 0 = no query sees a key (skipped), 1 =
    some do (masked), 2 = every query sees every key (no mask). Conservative: built from
    position and segment ranges. Returns int [nq, nk]."""
    q_lo, q_hi, qs_lo, qs_hi = (
        r.T[:, :, None] for r in _ranges(queries.pos, queries.seg, QUERY_PAD_SEGMENT)
    )
    k_lo, k_hi, ks_lo, ks_hi = (r[:, None] for r in _ranges(keys.pos, keys.seg, KEY_PAD_SEGMENT))
    some = (k_lo <= q_hi) & (ks_lo <= qs_hi) & (ks_hi >= qs_lo)  # [B, nq, nk]
    every = (k_hi <= q_lo) & (ks_lo == ks_hi) & (qs_lo == qs_hi) & (ks_lo == qs_lo)
    every &= (keys.seg != KEY_PAD_SEGMENT).all(axis=2)[:, None]
    return jnp.where(every.all(axis=0), 2, jnp.where(some.any(axis=0), 1, 0))


def _attend_key_blocks(
    q_i: jax.Array, pos_i: jax.Array, seg_i: jax.Array, kind_i: jax.Array, keys: KeyBlocks
) -> jax.Array:
    """One query block (q_i [B, K, G*bq, H], positions/segments [B, bq]) over every key block,
    skipped or masked by kind_i [nk] (`_block_kinds`), with an online softmax. Returns the
    normalised float32 output [B, K, G*bq, H]."""
    bsz, kv, rows, h = q_i.shape
    bq = pos_i.shape[1]
    bk = keys.k.shape[3]
    scale = 1.0 / math.sqrt(h)

    def attend(carry: tuple[jax.Array, ...], j: Any, masked: bool) -> tuple[jax.Array, ...]:
        acc, m, total = carry
        s = jnp.einsum("bkxh,bkyh->bkxy", q_i, keys.k[:, :, j], preferred_element_type=jnp.float32)
        s = s * scale
        if masked:
            vis = (keys.pos[:, j][:, None, :] <= pos_i[:, :, None]) & (
                keys.seg[:, j][:, None, :] == seg_i[:, :, None]
            )  # [B, bq, bk]; the rows of s are (G, bq)
            s = jnp.where(vis[:, None, None], s.reshape(bsz, kv, rows // bq, bq, bk), _MASKED)
            s = s.reshape(bsz, kv, rows, bk)
        # A row that has seen only masked scores has max -1e30 and sums garbage with weight 1;
        # its first visible key rescales that by exp(-1e30 - max) = 0.
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        pv = jnp.einsum(
            "bkxy,bkyh->bkxh",
            p.astype(keys.v.dtype),
            keys.v[:, :, j],
            preferred_element_type=jnp.float32,
        )
        return acc * corr[..., None] + pv, m_new, total * corr + p.sum(axis=-1)

    def visit(carry: Any, j: Any) -> tuple[Any, None]:
        branches = [
            lambda c: c,
            lambda c: attend(c, j, masked=True),
            lambda c: attend(c, j, masked=False),
        ]
        return jax.lax.switch(kind_i[j], branches, carry), None

    # *_like the query block: under shard_map the carry then varies over its mesh axes.
    acc = jnp.zeros_like(q_i, jnp.float32)
    state = (acc, jnp.full_like(acc[..., 0], _MASKED), jnp.zeros_like(acc[..., 0]))
    acc, _, total = jax.lax.scan(visit, state, jnp.arange(keys.k.shape[2]))[0]
    return acc / total[..., None]


def global_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    q_positions: jax.Array,
    k_positions: jax.Array,
    q_segment_ids: jax.Array | None = None,
    k_segment_ids: jax.Array | None = None,
    block_q: int = 512,
    block_k: int = 512,
    kv_head_major: bool = False,
) -> jax.Array:
    """Causal attention by original position for arbitrary query positions.

    q: [B, Lq, N, H] at q_positions [B, Lq]; k, v: [B, Lk, K, H] at k_positions [B, Lk]
    ([B, K, Lk, H] with kv_head_major=True: a head-major KV cache is read in place, block by
    block, with no copy). Queries need not be aligned with keys (output-stream copies, a
    prompt's last token, a decode step against a cache). Returns [B, Lq, N, H] in q's dtype.
    """
    if not kv_head_major:
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    lq, n, h = q.shape[1:]
    kv, lk = k.shape[1], k.shape[2]
    q_seg = _default_segments(q_segment_ids, q)
    k_seg = _default_segments(k_segment_ids, k_positions)
    q_pos = jnp.asarray(q_positions, jnp.int32)  # numpy inputs must not be indexed by tracers
    k_pos = jnp.asarray(k_positions, jnp.int32)

    if lq == 1:  # one query per row: a plain dot over the keys
        return few_query_attention(q, k, v, visibility(q_pos, q_seg, k_pos, k_seg))

    bq = min(block_q, _round_up(lq, 8))
    queries = _block_queries(q, q_pos, q_seg, kv, bq)
    keys = _block_keys(k, v, k_pos, k_seg, min(block_k, _round_up(lk, 8)))
    kind = _block_kinds(queries, keys)
    # Each query block is rematerialised in the backward pass (memory-efficient attention, Rabe
    # & Staats 2021): the gradient keeps one block's O(block_q * Lk) scores live, not all of
    # them, O(Lq * Lk). prevent_cse=False: the map is a scan already.
    attend = jax.checkpoint(_attend_key_blocks, prevent_cse=False)
    out = jax.lax.map(lambda a: attend(a[0], a[1], a[2], a[3], keys), (*queries, kind))
    nq, bsz = out.shape[:2]  # out [nq, B, K, G*bq, H]
    out = out.reshape(nq, bsz, kv, n // kv, bq, h).transpose(1, 0, 4, 2, 3, 5)
    return out.reshape(bsz, nq * bq, n, h)[:, :lq].astype(q.dtype)


def visibility(
    q_positions: jax.Array,
    q_segment_ids: jax.Array,
    k_positions: jax.Array,
    k_segment_ids: jax.Array,
    window: int | None = None,
) -> jax.Array:
    """[B, Lq, Lk] bool, the one mask rule: same segment, key at or before the query, and
    within `window` keys (itself included) if given."""
    qp, kp = q_positions[:, :, None], k_positions[:, None, :]
    mask = (kp <= qp) & (q_segment_ids[:, :, None] == k_segment_ids[:, None, :])
    if window is not None:
        mask &= qp - kp < window
    return mask


def check_positions_contract(positions: Any, segment_ids: Any | None = None) -> None:
    """Raises ValueError unless positions rise by at least one per array index inside each
    segment (the contract `local_attention` relies on: it finds a query's window among the
    array's previous keys). Checked only for concrete (non-traced) arrays; traced callers
    (jit) must uphold it: packed documents restart positions, output copies are never aligned
    keys, and repeated positions (e.g. `arange(T) // 4`) are not supported."""
    if isinstance(positions, jax.core.Tracer) or isinstance(segment_ids, jax.core.Tracer):
        return
    pos = np.asarray(positions)
    if pos.ndim != 2 or pos.shape[1] < 2:
        return
    seg = np.ones_like(pos) if segment_ids is None else np.asarray(segment_ids)
    same = seg[:, 1:] == seg[:, :-1]
    bad = same & (pos[:, 1:] <= pos[:, :-1])
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"positions must increase along the sequence inside a segment (sliding-window "
            f"attention reads a token's window from the keys before it): row {row} has "
            f"position {int(pos[row, col + 1])} at index {col + 1} after {int(pos[row, col])} "
            f"at index {col} in the same segment {int(seg[row, col])}"
        )
