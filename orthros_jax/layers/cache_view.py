"""Cache views: where an attention-like kind finds its cache entries in a cached mode.

A kind whose state is K/V over cache slots (attention) asks `ctx.view` where its base tokens'
K/V go and which keys its queries may read; where those keys come from (this device's slots,
a halo of the slots before a sequence shard, a gather, split across shards) is the view's
business, so the kind has no sequence-parallel code. The protocol is kind.CacheView; `SlotView`
is the single-device view the cached drivers build; parallel/sequence.py has the
sequence-parallel one.

Slot s of a row holds the token at position s; masks compare slots. Shapes: B batch, L base
tokens, S slots, W window, K kv heads, H head dim; a K/V stack is [layers, B, K, S, H].
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.kernels import slots as slot_ops
from orthros_jax.kernels.attention import KEY_PAD_SEGMENT
from orthros_jax.layers.attend import Keys
from orthros_jax.layers.kind import CHUNK, KV, LayerIndex, Mode, Stream


def slot_segments(visible_BS: jax.Array) -> jax.Array:
    """[B, S] segment ids of cache slots: 1 where a query may read, padding elsewhere."""
    return jnp.where(visible_BS, 1, KEY_PAD_SEGMENT).astype(jnp.int32)


def read_slots(
    ck: jax.Array,
    cv: jax.Array,
    li: LayerIndex,
    slots_BL: jax.Array,
    segments_BS: jax.Array,
    first: jax.Array | int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """K/V [B, K, L, H] and segments [B, L] of layer li at slots [B, L] (global ids; this
    cache holds slots first .. first + S - 1); any other slot is padding."""
    s = segments_BS.shape[1]
    local = slots_BL - first
    mine = (local >= 0) & (local < s)
    own_seg = jnp.take_along_axis(segments_BS, jnp.clip(local, 0, s - 1), 1)
    seg = jnp.where(mine, own_seg, KEY_PAD_SEGMENT)
    return slot_ops.read(ck, li, local), slot_ops.read(cv, li, local), seg


def chunk_keys(
    k_BLKH: jax.Array,
    v_BLKH: jax.Array,
    seg_BL: jax.Array,
    base: Stream,
    window: tuple[jax.Array, jax.Array, jax.Array, jax.Array],
) -> Keys:
    """A prefill chunk's window keys: its own K/V aligned with its queries, after the W-1 slots
    before it (window: head-major k, v [B, K, W-1, H], their slots and segments [B, W-1])."""
    wk, wv, win, win_seg = window
    prefix = (jnp.swapaxes(wk, 1, 2), jnp.swapaxes(wv, 1, 2), win, win_seg)
    return Keys(k_BLKH, v_BLKH, base.positions, seg_BL, prefix=prefix, aligned=True)


class SlotView(flax.struct.PyTreeNode):
    """The cache of this device: every row's slots 0 .. S - 1.

    slots [B, L]: where the base tokens' K/V go (chunk / decode; S = dropped).
    window_slots: chunk [B, W-1] (the slots right before the chunk), decode / read [B, W] (the
      window ending at the query, itself last); negative or beyond the end = not visible.
    slot_segments [B, S]: 1 for slots a global query may read, padding otherwise.
    global_slots [B, Wd]: a self-speculative draft (inference/speculative.py): the global keys
      are only these slots (the last Wd, read like the window: O(Wd)); None: every slot.
    """

    window_slots: jax.Array
    slot_segments: jax.Array
    slots: jax.Array | None = None
    global_slots: jax.Array | None = None

    def write(self, stack: jax.Array, li: LayerIndex, x_BLKH: jax.Array) -> jax.Array:
        assert self.slots is not None, "a view without slots is read-only (read mode)"
        return slot_ops.write(stack, li, self.slots, x_BLKH)

    def keys(
        self,
        ck: jax.Array,
        cv: jax.Array,
        li: LayerIndex,
        mode: Mode,
        base: Stream | None,
        kv: KV | None,
    ) -> tuple[Keys, Keys]:
        bsz, s = self.slot_segments.shape
        slot_ids = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (bsz, s))
        full = Keys(
            slot_ops.layer_view(ck, li),
            slot_ops.layer_view(cv, li),
            slot_ids,
            self.slot_segments,
            stack=(ck, cv, li),
            head_major=True,
        )
        if self.global_slots is not None:
            gk, gv, g_seg = read_slots(ck, cv, li, self.global_slots, self.slot_segments)
            full = Keys(gk, gv, self.global_slots, g_seg, head_major=True)
        win = self.window_slots
        wk, wv, win_seg = read_slots(ck, cv, li, win, self.slot_segments)
        if mode == CHUNK:
            assert kv is not None and base is not None
            seg = jnp.ones(base.positions.shape, jnp.int32)
            return chunk_keys(kv[0], kv[1], seg, base, (wk, wv, win, win_seg)), full
        return Keys(wk, wv, win, win_seg, head_major=True), full
