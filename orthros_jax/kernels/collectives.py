"""Sequence-parallel attention: collective kernels meant to run inside `jax.shard_map`.

The sequence axis (and a KV cache's slot axis) is split contiguously over the P shards of a
mesh axis (`axis_name`, e.g. "sequence"): shard i holds rows [i * Ls, (i + 1) * Ls) of a
length-T array, Ls = T / P. Arguments are per-shard blocks; masks come from positions and
segment ids, exactly as in attention.py, so rows a shard receives as padding are masked by
their segment (KEY_PAD_SEGMENT), never by array index.

  halo                          the `halo_len` rows before this shard, by `lax.ppermute`
                                (several hops when halo_len > Ls); bytes independent of T
  sharded_global_attention_partial, merge_partials
                                split-K attention for a few replicated queries per row over
                                sharded keys, merged across shards by log-sum-exp
The sequence-parallel prefill (inference/drivers.prefill on each shard) builds the base stream's
window from `halo` and the Transformer arm's keys by all-gathering each layer's K/V; bytes per
collective from compiled HLO in hlo_stats.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from orthros_jax.kernels.attention import visibility
from orthros_jax.kernels.few_queries import few_query_partial


def check_sequence_split(length: int, n_shards: int, what: str = "sequence length") -> int:
    """Validates that `length` rows split evenly over `n_shards`; returns the shard length."""
    if not isinstance(n_shards, int) or n_shards < 1:
        raise ValueError(f"the sequence axis size must be a positive int, got {n_shards!r}")
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"{what} must be a positive int, got {length!r}")
    if length % n_shards:
        fit = -(-length // n_shards) * n_shards
        raise ValueError(
            f"{what} {length} is not divisible by the sequence axis size {n_shards}; "
            f"use a multiple of {n_shards} (e.g. {fit}, padding the rest)"
        )
    return length // n_shards


def _check_seq_shapes(name: str, shape: tuple[int, ...], batch: int, length: int) -> None:
    if shape[:2] != (batch, length):
        raise ValueError(
            f"{name} has shape {shape}; expected [B={batch}, L={length}, ...] (per-shard block)"
        )


def halo(
    x_shard: jax.Array, halo_len: int, axis_name: str, *, axis: int = 1, fill: Any = 0
) -> jax.Array:
    """The `halo_len` rows (along `axis`) that precede this shard in the unsplit array.

    x_shard: this shard's block, e.g. K/V [B, Ls, K, H], positions/segments [B, Ls], or a
    head-major cache layer [B, K, Ls, H] with axis=2. Returns x_shard's shape with
    shape[axis] = halo_len; the last row is the one right before this shard's first row.
    Rows before the start of the sequence (shard 0, or near shards when the halo spans more
    shards than exist before this one) are `fill`: give positions attention.PAD_POSITION and
    segments KEY_PAD_SEGMENT so that attention masks them. Hop j receives from shard i - j: every
    hop but the farthest moves a whole shard, the farthest only the rows still needed, so each
    shard receives exactly halo_len rows whatever T is.
    """
    if not isinstance(halo_len, int) or halo_len < 0:
        raise ValueError(f"halo: halo_len must be an int >= 0, got {halo_len!r}")
    if not -x_shard.ndim <= axis < x_shard.ndim:
        raise ValueError(f"halo: axis {axis} is out of range for an array of shape {x_shard.shape}")
    ls = x_shard.shape[axis]
    if halo_len == 0 or ls == 0:
        shape = list(x_shard.shape)
        shape[axis] = halo_len
        return jnp.full(shape, fill, x_shard.dtype)
    n = jax.lax.axis_size(axis_name)
    me = jax.lax.axis_index(axis_name)
    hops = -(-halo_len // ls)
    parts = []
    for j in range(hops, 0, -1):  # farthest first: the result is in sequence order
        rows = ls if j < hops else halo_len - (hops - 1) * ls
        piece = jax.lax.slice_in_dim(x_shard, ls - rows, ls, axis=axis)
        if j >= n:  # no shard that far back: all padding, nothing to send
            parts.append(jnp.full_like(piece, fill))
            continue
        got = jax.lax.ppermute(piece, axis_name, [(i, i + j) for i in range(n - j)])
        parts.append(jnp.where(me >= j, got, jnp.asarray(fill, got.dtype)))
    return jnp.concatenate(parts, axis=axis)


class Partial(NamedTuple):
    """One shard's share of an attention: out [B, Q, N, H] (normalised over this shard's
    visible keys, 0 where it sees none), max and sum [B, Q, N] of its scores (float32)."""

    out: jax.Array
    max: jax.Array
    sum: jax.Array


def sharded_global_attention_partial(
    q: jax.Array,
    k_shard: jax.Array,
    v_shard: jax.Array,
    q_positions: jax.Array,
    k_positions_shard: jax.Array,
    q_segment_ids: jax.Array | None = None,
    k_segment_ids_shard: jax.Array | None = None,
    *,
    kv_head_major: bool = False,
    window: int | None = None,
) -> Partial:
    """Causal attention of a few queries per row over this shard's keys (inside shard_map).

    q: [B, Q, N, H] at q_positions [B, Q], the same on every shard (a prefill's last token, a
    decode step); k_shard, v_shard: [B, Ls, K, H], or [B, K, Ls, H] with kv_head_major=True (a
    sharded cache layer read in place); k_positions_shard [B, Ls]. A key is visible when its
    position <= the query's and the segments match (default: all 1) and, given a `window`,
    the query's position - the key's < window (a decode step's sliding-window read, wherever
    it straddles shards). Returns this shard's Partial; `merge_partials` combines them.
    """
    bsz, nq, n, h = q.shape
    kv_axis, seq_axis = (1, 2) if kv_head_major else (2, 1)
    kv = k_shard.shape[kv_axis] if k_shard.ndim == 4 else 0
    ls = k_shard.shape[seq_axis] if k_shard.ndim == 4 else 0
    want = (bsz, kv, ls, h) if kv_head_major else (bsz, ls, kv, h)
    if kv == 0 or k_shard.shape != want or v_shard.shape != want or n % kv:
        layout = "[B, K, Ls, H]" if kv_head_major else "[B, Ls, K, H]"
        raise ValueError(
            f"sharded_global_attention_partial: q {q.shape} and k/v {k_shard.shape}/"
            f"{v_shard.shape} do not fit: k and v must be {layout} with B={bsz}, H={h} and a "
            f"number of kv heads dividing N={n}"
        )
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(
            f"sharded_global_attention_partial: window must be None or an int >= 1, got {window!r}"
        )
    _check_seq_shapes("q_positions", q_positions.shape, bsz, nq)
    _check_seq_shapes("k_positions_shard", k_positions_shard.shape, bsz, ls)
    ones = lambda n: jnp.ones((bsz, n), jnp.int32)
    q_seg = ones(nq) if q_segment_ids is None else jnp.asarray(q_segment_ids, jnp.int32)
    k_seg = ones(ls) if k_segment_ids_shard is None else jnp.asarray(k_segment_ids_shard, jnp.int32)
    visible = visibility(
        jnp.asarray(q_positions, jnp.int32),
        q_seg,
        jnp.asarray(k_positions_shard, jnp.int32),
        k_seg,
        window,
    )
    if not kv_head_major:
        k_shard, v_shard = jnp.swapaxes(k_shard, 1, 2), jnp.swapaxes(v_shard, 1, 2)
    acc, m, total = few_query_partial(q, k_shard, v_shard, visible)
    return Partial(acc / jnp.where(total > 0, total, 1.0)[..., None], m, total)


def merge_partials(
    out: jax.Array, row_max: jax.Array, row_sum: jax.Array, axis_name: str
) -> jax.Array:
    """Combines every shard's Partial (inside shard_map) into the attention over all keys.

    out: [B, Q, N, H], row_max, row_sum: [B, Q, N] (a Partial's fields, in order). One pmax
    of the maxima, then one psum of the rescaled outputs with their rescaled sums appended as
    an extra column. Shards that see no visible key have sum 0 and contribute nothing; a query
    no shard can see gets 0.
    Returns float32 [B, Q, N, H], the same on every shard.
    """
    if out.shape[:-1] != row_max.shape or row_sum.shape != row_max.shape:
        raise ValueError(
            f"merge_partials: out {out.shape} must be [B, Q, N, H] with max/sum [B, Q, N]; "
            f"got max {row_max.shape}, sum {row_sum.shape}"
        )
    m = jax.lax.pmax(row_max, axis_name)
    w = row_sum * jnp.exp(row_max - m)
    both = jax.lax.psum(jnp.concatenate([out * w[..., None], w[..., None]], axis=-1), axis_name)
    den = both[..., -1:]
    return both[..., :-1] / jnp.where(den > 0, den, 1.0)
