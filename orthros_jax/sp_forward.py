"""Sequence-parallel drivers: prefill and decode over a KV cache whose slots are split over the
"sequence" mesh axis (rows over the batch axes, e.g. "data"), each one `jax.shard_map`.

Shapes: B batch (b per shard), S cache slots (Ls = S / P per shard of P), C chunk, D d_model,
V vocab, W window. Shard i owns slots [i * Ls, (i + 1) * Ls) of every row. Positions, window
slots and masks stay global slot ids (StepContext.slot_offset); a shard writes only the slots
it owns and sees other shards' keys only through collectives. Every layer runs the attention
kind's one `step` (attention_layer.py) with the attention implementation "sequence"
(attend.py); decode and the last token's read pass are cached_forward's drivers per shard.

prefill, layer by layer, each shard over its own slice of the slot grid, in chunks of C: the
token at slot s of row b is prompt token s - start_b (start = cache.lengths), so a prompt
continues a partly filled cache and slots outside [start, end) keep what they hold. Per layer:
  window arms (orthros, swa): the shard's last min(W-1, Ls) slots are written first, then each
    shard receives the W-1 slots before it (sequence_parallel.halo; several hops when W-1 > Ls):
    the same bytes at any prompt length.
  transformer: every slot is written first, then the layer's K/V is all-gathered (MaxText's
    default strategy for the baseline).
  then the step runs over the slice's chunks that hold prompt tokens.
Why layer by layer: the first chunk of shard i needs shard i-1's last keys of the same layer, so
chunk-by-chunk order would make every shard wait for the previous one's whole slice. Memory per
device: the cache shard, the slice's activations [b, Ls, D] and one chunk's temporaries.
The last layer only writes its K/V (its base output is dead); then the last token: the orthros
output stream through every layer, or a single-stream arm's last token through the last layer
(its hidden state broadcast from the shard owning its slot), split-K over the shards.

decode: cached_forward.decode per shard: the new token's K/V lands on the shard owning its slot;
the window read (which may straddle shards) and the global read are split-K partials merged
across shards by log-sum-exp.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orthros_jax import cached_forward as fwd
from orthros_jax import kv_cache as kvc
from orthros_jax import sequence_parallel as sp
from orthros_jax import sharding, stack
from orthros_jax.attend import Keys
from orthros_jax.config import ModelConfig
from orthros_jax.kv_cache import KVCache
from orthros_jax.layer_kind import CHUNK, LayerKind, Params, StepContext, Stream

SEQ = sp.SEQUENCE_AXIS
IMPL = "sequence"


def sequence_size(mesh: Mesh | None) -> int:
    """Size of the mesh's "sequence" axis (1 without a mesh or without the axis)."""
    return 1 if mesh is None else int(mesh.shape.get(SEQ, 1))


def mesh_of(cache: KVCache) -> Mesh | None:
    """The mesh a cache from init_cache(..., mesh=) is split over, if its slots are split (a
    "sequence" axis > 1); None for any other cache (which runs the single-program drivers)."""
    sh = getattr(cache.k, "sharding", None)
    if isinstance(sh, NamedSharding) and sequence_size(sh.mesh) > 1:
        return sh.mesh
    return None


def check_mesh(cfg: ModelConfig, batch_size: int, max_len: int, mesh: Mesh) -> None:
    """ValueError (before anything compiles) unless a cache of batch_size rows and max_len
    slots can be split over the mesh: rows over its batch axes, slots over "sequence"."""
    sharding.check_batch_divisible(batch_size, mesh, "batch size")
    seq = sequence_size(mesh)
    if seq == 1:
        return
    sp.check_sequence_split(max_len, seq, "cache length (max_len)")
    other = sorted(set(cfg.layer_types) - {"attention"})
    if other:
        raise ValueError(
            f"sequence parallelism (mesh axis 'sequence' = {seq}) supports attention layers "
            f"only; layer_types {cfg.layer_types} has {other}: use a mesh without a sequence axis"
        )
    if mesh.shape.get("tensor", 1) > 1:
        raise ValueError(
            f"a sequence axis ({seq}) cannot be combined with tensor parallelism (tensor = "
            f"{mesh.shape['tensor']}); use sharding.sequence_mesh(sequence, data)"
        )


def specs(cfg: ModelConfig, mesh: Mesh, batch: int, max_len: int) -> tuple[KVCache, Any]:
    """shard_map specs: the cache's (by sharding.RULES) and the rows' mesh axes (or None)."""
    sh = sharding.cache_shardings(cfg, batch, max_len, mesh)
    rows = sh.lengths.spec[0] if len(sh.lengths.spec) else None
    return KVCache(k=sh.k.spec, v=sh.v.spec, lengths=sh.lengths.spec), rows


def slot_tokens(tokens: np.ndarray, lengths: np.ndarray, held: np.ndarray, max_len: int):
    """Prompts on the cache's slot grid: [B, S] int32 holding row b's prompt token t at slot
    held[b] + t (zeros elsewhere). tokens [B, T] right-padded, lengths/held [B]."""
    out = np.zeros((tokens.shape[0], max_len), np.int32)
    rows, cols = np.nonzero(np.arange(tokens.shape[1])[None] < lengths[:, None])
    out[rows, held[rows] + cols] = tokens[rows, cols]
    return out


# ---------------------------------------------------------------- prefill


def _prefill_shard(params: Params, cache: KVCache, tokens: jax.Array, lengths: jax.Array, *,
                   cfg: ModelConfig):  # fmt: skip
    """One shard's prefill (inside shard_map). cache: this shard's slots [.., b, K, Ls, H];
    tokens [b, Ls]: the tokens at its slots; lengths [b] prompt lengths. Returns (logits
    [b, V], cache)."""
    bsz, ls = cache.batch_size, cache.max_len
    w = cfg.window
    off = jax.lax.axis_index(SEQ) * ls
    start = cache.lengths
    end = start + lengths
    chunk = min(cfg.prefill_chunk, ls)
    n_chunks = -(-ls // chunk)
    grid = jnp.arange(n_chunks * chunk, dtype=jnp.int32)  # local rows; >= Ls: padding
    glob = off + grid
    valid = (glob[None] >= start[:, None]) & (glob[None] < end[:, None]) & (grid < ls)[None]
    slot_seg = fwd.slot_segments((off + grid[:ls])[None] < end[:, None])
    # Only chunks holding a prompt token of some row run (a short prompt in a long cache).
    has = valid.reshape(bsz, n_chunks, chunk).any(axis=(0, 2))
    lo = jnp.where(has.any(), jnp.argmax(has), 0)
    hi = jnp.where(has.any(), n_chunks - jnp.argmax(has[::-1]), 0)
    x = fwd.embed(params, jnp.pad(tokens, ((0, 0), (0, grid.size - ls))), cfg)

    def run(x, states, kind: LayerKind, p, li, first, size: int, compute_base: bool, **remote):
        """The step over local rows [first, first + size) of the grid (a chunk)."""
        idx = first + jnp.arange(size, dtype=jnp.int32)
        pos = jnp.broadcast_to(off + idx, (bsz, size))
        ok = jax.lax.dynamic_slice_in_dim(valid, first, size, 1)
        ctx = StepContext(
            mode=CHUNK,
            impl=IMPL,
            slots=jnp.where(ok, idx, ls),  # slots without a prompt token -> Ls: dropped
            window_slots=fwd.window_before(pos[:, 0], w),
            slot_segments=slot_seg,
            valid=ok,
            slot_offset=off,
            **remote,
        )
        xc = jax.lax.dynamic_slice_in_dim(x, first, size, 1)
        base = Stream(xc, pos, jnp.ones_like(pos))
        base, _, st = kind.step(p, cfg, base, None, states[kind.name], li, ctx, compute_base)
        if compute_base:
            x = jax.lax.dynamic_update_slice_in_dim(x, base.x, first, 1)
        return x, {**states, kind.name: st}

    def chunks(carry, kind, p, li, compute_base: bool, **remote):
        body = lambda c, xs: run(*xs, kind, p, li, c * chunk, chunk, compute_base, **remote)
        return jax.lax.fori_loop(lo, hi, body, carry)

    def layer(carry, kind: LayerKind, p, li):
        x, states = carry
        if cfg.base_window is None:  # causal over every slot: all-gather the layer's K/V
            x, states = chunks((x, states), kind, p, li, False)
            remote = {"gathered": _gathered(states, li, end)}
        elif w > 1:  # the window: the last W-1 slots of the shards before, by halo exchange
            tail = min(w - 1, ls)
            x, states = run(x, states, kind, p, li, ls - tail, tail, False)
            remote = {"halo": _halo(states, li, off, w - 1, end)}
        else:
            remote = {}
        return chunks((x, states), kind, p, li, True, **remote)

    def last(carry, kind: LayerKind, p, li):  # its base output is dead: write K/V only
        return chunks(carry, kind, p, li, False)

    x, states = stack.layer_loop(params, cfg, (x, cache.states()), layer, by_index=True, last=last)
    cache = cache.with_states(states, end)
    # Each row's last prompt token lies on one shard: broadcast what the read pass needs.
    here = end - 1 - off
    mine = (here >= 0) & (here < ls)
    at = jnp.clip(here, 0, ls - 1)
    if cfg.two_streams:
        tok = jnp.take_along_axis(tokens, at[:, None], 1)[:, 0]
        tok = jax.lax.psum(jnp.where(mine, tok, 0), SEQ)
        x0 = fwd.embed(params, tok[:, None], cfg)[:, 0]
        last_x = fwd.read_pass(
            params, cfg, cache, x0, impl=IMPL, base=False, last_only=False, slot_offset=off
        )
    else:
        got = jnp.take_along_axis(x, at[:, None, None], 1)[:, 0]
        x_in = jax.lax.psum(jnp.where(mine[:, None], got, 0), SEQ)
        last_x = fwd.read_pass(
            params, cfg, cache, x_in, impl=IMPL, base=True, last_only=True, slot_offset=off
        )
    return fwd.logits_of(params, last_x, cfg), cache


def _halo(states, li, off, rows: int, end: jax.Array) -> Keys:
    """Head-major Keys of the `rows` slots right before this shard at layer li (received from
    the shards before it); slots before 0 or past each row's end are padding."""
    ck, cv = states["attention"]
    k = sp.halo(kvc.layer_view(ck, li), rows, SEQ, axis=2)
    v = sp.halo(kvc.layer_view(cv, li), rows, SEQ, axis=2)
    slots = jnp.broadcast_to(off - rows + jnp.arange(rows, dtype=jnp.int32), (end.shape[0], rows))
    seg = fwd.slot_segments((slots >= 0) & (slots < end[:, None]))
    return Keys(k, v, slots, seg, head_major=True)


def _gathered(states, li, end: jax.Array) -> Keys:
    """Head-major Keys of every slot of layer li (all-gathered over the shards)."""
    ck, cv = states["attention"]
    gather = lambda a: jax.lax.all_gather(kvc.layer_view(a, li), SEQ, axis=2, tiled=True)
    k, v = gather(ck), gather(cv)
    slots = jnp.broadcast_to(jnp.arange(k.shape[2], dtype=jnp.int32), (end.shape[0], k.shape[2]))
    seg = fwd.slot_segments(slots < end[:, None])
    return Keys(k, v, slots, seg, head_major=True)


@functools.partial(jax.jit, static_argnames=("cfg", "mesh"), donate_argnames=("cache",))
def prefill(params: Params, cache: KVCache, tokens: jax.Array, lengths: jax.Array, *,
            cfg: ModelConfig, mesh: Mesh) -> tuple[jax.Array, KVCache]:  # fmt: skip
    """Prefill of a cache split over `mesh` (see the module docstring). tokens [B, S]: the
    prompts on the slot grid (`slot_tokens`), split like the cache's slots; lengths [B] >= 1.
    Returns (logits [B, V] at each prompt's last token, the cache split the same way)."""
    cache_spec, rows = specs(cfg, mesh, cache.batch_size, cache.max_len)
    fn = jax.shard_map(
        functools.partial(_prefill_shard, cfg=cfg),
        mesh=mesh,
        in_specs=(P(), cache_spec, P(rows, SEQ), P(rows)),
        out_specs=(P(rows), cache_spec),
        # A Pallas kernel's outputs carry no varying-axes types (splash's prefill chunks).
        check_vma=cfg.attention_impl != "splash",
    )
    return fn(params, cache, tokens, lengths)


# ---------------------------------------------------------------- decode


def decode(params: Params, cache: KVCache, tokens: jax.Array, active: jax.Array, *,
           cfg: ModelConfig, mesh: Mesh) -> tuple[jax.Array, KVCache]:  # fmt: skip
    """cached_forward.decode on a cache split over `mesh` (traceable inside jit: generate's
    loop). tokens, active [B] -> (logits [B, V], cache split the same way)."""
    cache_spec, rows = specs(cfg, mesh, cache.batch_size, cache.max_len)

    def shard(params, cache, tokens, active):
        off = jax.lax.axis_index(SEQ) * cache.max_len
        return fwd.decode(params, cache, tokens, active, cfg=cfg, impl=IMPL, slot_offset=off)

    fn = jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(P(), cache_spec, P(rows), P(rows)),
        out_specs=(P(rows), cache_spec),
    )
    return fn(params, cache, tokens, active)


decode_jit = jax.jit(decode, static_argnames=("cfg", "mesh"), donate_argnames=("cache",))
