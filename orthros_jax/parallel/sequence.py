"""Sequence parallelism as a cache view: a cache whose slots are split over the "sequence" mesh
axis, seen from one shard (inside `jax.shard_map`), and the attention implementation that
merges shards' partial results. inference/drivers.py's drivers run on each shard with it
(inference/sequence_parallel.py).

Shard i of P holds global slots [i * Ls, (i + 1) * Ls) of every row (slot_offset = i * Ls);
positions, window slots and masks stay global slot ids. A shard writes only its own slots
(others are dropped) and sees other shards' keys only through what the driver hands the view:
`halo` (the slots right before the shard, which a prefill chunk's window reads) and `gathered`
(every slot of the layer, which a chunk's global queries read); without `gathered`, global keys
and decode's window are `split`: this shard's share, attended split-K by `SequenceAttention`
and merged across shards by log-sum-exp. Only kinds whose state is K/V over slots
(the kinds that are not LayerKind.recurrent; a (k, v) pair of [layers, B, K, S, H] stacks) run this
way.

Shapes: B batch (per shard), L base tokens, S (= Ls) slots per shard, W window.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from orthros_jax.axes import EXPERT_AXIS, SEQUENCE_AXIS
from orthros_jax.config import ModelConfig
from orthros_jax.kernels import collectives
from orthros_jax.kernels import slots as slot_ops
from orthros_jax.layers import attention_impls
from orthros_jax.layers.attend import FEW_QUERIES, Keys
from orthros_jax.layers.cache_view import chunk_keys, read_slots, slot_segments
from orthros_jax.layers.kind import CHUNK, KV, LayerIndex, Mode, Stream
from orthros_jax.layers.registry import kinds_of
from orthros_jax.parallel import mesh as pmesh

SEQ = SEQUENCE_AXIS


def sequence_size(mesh: Mesh | None) -> int:
    """Size of the mesh's "sequence" axis (1 without a mesh or without the axis)."""
    return 1 if mesh is None else int(mesh.shape.get(SEQ, 1))


def check_mesh(cfg: ModelConfig, batch_size: int, max_len: int, mesh: Mesh) -> None:
    """ValueError (before anything compiles) unless a cache of batch_size rows and max_len
    slots can be split over the mesh: rows over its batch axes, slots over "sequence". Over
    the expert axis rows may stay whole (a batch-1 decode with the experts split: every device
    runs the row through its own experts, layers/expert_parallel)."""
    pmesh.check_batch_divisible(batch_size, mesh, "batch size", whole_over=(EXPERT_AXIS,))
    seq = sequence_size(mesh)
    if seq == 1:
        return
    collectives.check_sequence_split(max_len, seq, "cache length (max_len)")
    other = [k.name for k in kinds_of(cfg) if k.recurrent]
    if other:
        raise ValueError(
            f"sequence parallelism (mesh axis 'sequence' = {seq}) needs layer kinds whose cache "
            f"grows with slots; layer_types {cfg.layer_types} has {other}: use a mesh without "
            "a sequence axis"
        )
    if mesh.shape.get("tensor", 1) > 1:
        raise ValueError(
            f"a sequence axis ({seq}) cannot be combined with tensor parallelism (tensor = "
            f"{mesh.shape['tensor']}); use parallel.mesh.sequence_mesh(sequence, data)"
        )


class ShardView(flax.struct.PyTreeNode):
    """One sequence shard's view of a split cache (a layers/cache_view.CacheView).

    slots [B, L]: this shard's local slots for the base tokens (S = dropped: tokens owned by
    other shards are never written). window_slots / slot_segments as cache_view.SlotView, but
    window_slots global and slot_segments [B, S] of this shard's slots. slot_offset: the global
    id of this shard's first slot. halo / gathered: Keys the driver received for this layer.
    """

    window_slots: jax.Array
    slot_segments: jax.Array
    slot_offset: jax.Array
    slots: jax.Array | None = None
    halo: Keys | None = None
    gathered: Keys | None = None

    def write(self, stack: jax.Array, li: LayerIndex, x_BLKH: jax.Array) -> jax.Array:
        assert self.slots is not None, "a view without slots is read-only (read mode)"
        return slot_ops.write(stack, li, self.slots, x_BLKH)

    def _read(
        self, ck: jax.Array, cv: jax.Array, li: LayerIndex, slots: jax.Array
    ) -> tuple[jax.Array, ...]:
        """read_slots over this shard's slots, then the halo's for the slots right before it."""
        k, v, seg = read_slots(ck, cv, li, slots, self.slot_segments, self.slot_offset)
        if self.halo is None:
            return k, v, seg
        h, s = self.halo, self.slot_segments.shape[1]
        mine = (slots >= self.slot_offset) & (slots < self.slot_offset + s)
        r = h.positions.shape[1]
        idx = slots - h.positions[:, :1]  # the halo holds consecutive slots
        in_halo = (idx >= 0) & (idx < r) & ~mine
        idx = jnp.clip(idx, 0, r - 1)
        sel = in_halo[:, None, :, None]
        k = jnp.where(sel, jnp.take_along_axis(h.k, idx[:, None, :, None], axis=2), k)
        v = jnp.where(sel, jnp.take_along_axis(h.v, idx[:, None, :, None], axis=2), v)
        seg = jnp.where(in_halo, jnp.take_along_axis(h.segment_ids, idx, 1), seg)
        return k, v, seg

    def keys(
        self,
        ck: jax.Array,
        cv: jax.Array,
        li: LayerIndex,
        mode: Mode,
        base: Stream | None,
        kv: KV | None,
    ) -> tuple[Keys, Keys]:
        """A chunk's own keys are read back from the cache after its write (a slot inside the
        chunk that holds an earlier prompt keeps it); its window's slots before the shard come
        from the halo; its global queries read `gathered` when given. Decode / read keys are
        this shard's share (split)."""
        bsz, s = self.slot_segments.shape
        full = self.gathered
        if full is None:
            slot_ids = jnp.broadcast_to(self.slot_offset + jnp.arange(s, dtype=jnp.int32), (bsz, s))
            full = Keys(
                slot_ops.layer_view(ck, li),
                slot_ops.layer_view(cv, li),
                slot_ids,
                self.slot_segments,
                head_major=True,
                split=True,
            )
        win = self.window_slots
        wk, wv, win_seg = self._read(ck, cv, li, win)
        if mode == CHUNK:
            assert base is not None
            k, v, seg = self._read(ck, cv, li, base.positions)
            own = (jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2))
            return chunk_keys(*own, seg, base, (wk, wv, win, win_seg)), full
        return Keys(wk, wv, win, win_seg, head_major=True, split=True), full


def halo_keys(state: KV, li: LayerIndex, off: jax.Array, rows: int, end: jax.Array) -> Keys:
    """Head-major Keys of the `rows` slots right before this shard at layer li (received from
    the shards before it, several hops when rows > S); slots before 0 or past each row's end
    are padding. state: the kind's (k, v) stacks."""
    ck, cv = state
    k = collectives.halo(slot_ops.layer_view(ck, li), rows, SEQ, axis=2)
    v = collectives.halo(slot_ops.layer_view(cv, li), rows, SEQ, axis=2)
    slots = jnp.broadcast_to(off - rows + jnp.arange(rows, dtype=jnp.int32), (end.shape[0], rows))
    return Keys(k, v, slots, slot_segments((slots >= 0) & (slots < end[:, None])), head_major=True)


def gathered_keys(state: KV, li: LayerIndex, end: jax.Array) -> Keys:
    """Head-major Keys of every slot of layer li, all-gathered over the shards."""
    ck, cv = state
    gather = lambda a: jax.lax.all_gather(slot_ops.layer_view(a, li), SEQ, axis=2, tiled=True)
    k, v = gather(ck), gather(cv)
    slots = jnp.broadcast_to(jnp.arange(k.shape[2], dtype=jnp.int32), (end.shape[0], k.shape[2]))
    return Keys(k, v, slots, slot_segments(slots < end[:, None]), head_major=True)


@dataclasses.dataclass(frozen=True)
class SequenceAttention:
    """The attention implementation of sequence parallelism (an attend.AttentionImpl): keys the
    view made whole on this shard (a chunk's window with its halo, a layer's gathered K/V) go
    to `inner` (cfg.attention_impl); a shard's share of `split` keys is attended split-K by a
    few queries per row and merged across shards by log-sum-exp."""

    inner: str

    def __call__(
        self,
        q: jax.Array,
        q_pos: jax.Array,
        q_seg: jax.Array,
        keys: Keys,
        window: int | None,
        cfg: ModelConfig,
    ) -> jax.Array:
        if not keys.split:
            return attention_impls.attend(self.inner, q, q_pos, q_seg, keys, window, cfg)
        if q.shape[1] > FEW_QUERIES or keys.prefix is not None or keys.aligned:
            raise ValueError(
                f"sequence-split keys are read split-K by a few queries per row (<= {FEW_QUERIES},"
                f" no prefix); got {q.shape[1]} queries: gather the keys first"
            )
        part = collectives.sharded_global_attention_partial(
            q,
            keys.k,
            keys.v,
            q_pos,
            keys.positions,
            q_seg,
            keys.segment_ids,
            kv_head_major=keys.head_major,
            window=window,
        )
        return collectives.merge_partials(*part, SEQ).astype(q.dtype)
