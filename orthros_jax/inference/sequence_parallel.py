"""Sequence-parallel drivers: prefill and decode over a KV cache whose slots are split over the
"sequence" mesh axis (rows over the batch axes, e.g. "data"), each one `jax.shard_map`.

Shapes: B batch (b per shard), S cache slots (Ls = S / P per shard of P), C chunk, D d_model,
V vocab, W window. Shard i owns slots [i * Ls, (i + 1) * Ls) of every row. Positions, window
slots and masks stay global slot ids; a shard writes only the slots it owns and sees other
shards' keys only through collectives. Every layer runs its kind's one `step` over a shard
view of the cache (parallel/sequence.ShardView) with sequence parallelism's attention
implementation (parallel/sequence.SequenceAttention); decode and the last token's read pass
are drivers.py's per shard.

prefill, layer by layer, each shard over its own slice of the slot grid, in chunks of C: the
token at slot s of row b is prompt token s - start_b (start = cache.lengths), so a prompt
continues a partly filled cache and slots outside [start, end) keep what they hold. Per layer:
  window arms (orthros, swa): the shard's last min(W-1, Ls) slots are written first, then each
    shard receives the W-1 slots before it (kernels/collectives.halo; several hops when W-1 > Ls):
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

decode: drivers.decode per shard: the new token's K/V lands on the shard owning its slot;
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

from orthros_jax.config import ModelConfig
from orthros_jax.inference import drivers as fwd
from orthros_jax.inference.cache import KVCache, cache_shardings, kv_cache_dtype
from orthros_jax.layers import stack
from orthros_jax.layers.cache_view import slot_segments
from orthros_jax.layers.kind import CHUNK, LayerKind, Params, StepContext, Stream
from orthros_jax.parallel import sequence as pseq
from orthros_jax.parallel.sequence import SEQ, SequenceAttention, ShardView, sequence_size

__all__ = ["decode", "decode_jit", "mesh_of", "prefill", "sequence_size", "slot_tokens", "specs"]


def mesh_of(cache: KVCache) -> Mesh | None:
    """The mesh a cache from init_cache(..., mesh=) is split over, if its slots are split (a
    "sequence" axis > 1); None for any other cache (which runs the single-program drivers)."""
    for leaf in jax.tree.leaves(cache.states):
        sh = getattr(leaf, "sharding", None)
        if (
            isinstance(sh, NamedSharding)
            and isinstance(sh.mesh, Mesh)
            and sequence_size(sh.mesh) > 1
        ):
            return sh.mesh
    return None


def specs(
    cfg: ModelConfig, mesh: Mesh, batch: int, max_len: int, kv_dtype: str | None = None
) -> tuple[KVCache, Any]:
    """shard_map specs: the cache's (by the rules; kv_dtype: a quantized cache's) and the rows'
    mesh axes (or None)."""
    sh = cache_shardings(cfg, batch, max_len, mesh, kv_dtype)
    spec = jax.tree.map(lambda s: s.spec, sh)
    rows = spec.lengths[0] if len(spec.lengths) else None
    return spec, rows


def slot_tokens(
    tokens: np.ndarray, lengths: np.ndarray, held: np.ndarray, max_len: int
) -> np.ndarray:
    """Prompts on the cache's slot grid: [B, S] int32 holding row b's prompt token t at slot
    held[b] + t (zeros elsewhere). tokens [B, T] right-padded, lengths/held [B]."""
    out = np.zeros((tokens.shape[0], max_len), np.int32)
    rows, cols = np.nonzero(np.arange(tokens.shape[1])[None] < lengths[:, None])
    out[rows, held[rows] + cols] = tokens[rows, cols]
    return out


# ---------------------------------------------------------------- prefill


def _prefill_shard(
    params: Params,
    cache: KVCache,
    tokens: jax.Array,
    lengths: jax.Array,
    *,
    cfg: ModelConfig,
    mesh: Mesh,
) -> tuple[jax.Array, KVCache]:
    """One shard's prefill (inside shard_map). cache: this shard's slots [.., b, K, Ls, H];
    tokens [b, Ls]: the tokens at its slots; lengths [b] prompt lengths. Returns (logits
    [b, V], cache)."""
    bsz, ls = cache.batch_size, cache.max_len // sequence_size(mesh)
    impl = SequenceAttention(cfg.attention_impl)
    w = cfg.window
    off = jax.lax.axis_index(SEQ) * ls
    start = cache.lengths
    end = start + lengths
    chunk = min(cfg.prefill_chunk, ls)
    n_chunks = -(-ls // chunk)
    grid = jnp.arange(n_chunks * chunk, dtype=jnp.int32)  # local rows; >= Ls: padding
    glob = off + grid
    valid = (glob[None] >= start[:, None]) & (glob[None] < end[:, None]) & (grid < ls)[None]
    slot_seg = slot_segments((off + grid[:ls])[None] < end[:, None])
    # Only chunks holding a prompt token of some row run (a short prompt in a long cache).
    has = valid.reshape(bsz, n_chunks, chunk).any(axis=(0, 2))
    lo = jnp.where(has.any(), jnp.argmax(has), 0)
    hi = jnp.where(has.any(), n_chunks - jnp.argmax(has[::-1]), 0)
    x = fwd.embed(params, jnp.pad(tokens, ((0, 0), (0, grid.size - ls))), cfg)

    def run(
        x: jax.Array,
        states: dict[str, Any],
        kind: LayerKind,
        p: Params,
        li: Any,
        first: Any,
        size: int,
        compute_base: bool,
        **remote: Any,
    ) -> tuple[jax.Array, Any]:
        """The step over local rows [first, first + size) of the grid (a chunk)."""
        idx = first + jnp.arange(size, dtype=jnp.int32)
        pos = jnp.broadcast_to(off + idx, (bsz, size))
        ok = jax.lax.dynamic_slice_in_dim(valid, first, size, 1)
        view = ShardView(
            window_slots=fwd.window_before(pos[:, 0], w),
            slot_segments=slot_seg,
            slot_offset=off,
            slots=jnp.where(ok, idx, ls),  # slots without a prompt token -> Ls: dropped
            **remote,
        )
        ctx = StepContext(mode=CHUNK, impl=impl, view=view, valid=ok)
        xc = jax.lax.dynamic_slice_in_dim(x, first, size, 1)
        base = Stream(xc, pos, jnp.ones_like(pos))
        new, _, st = kind.step(p, cfg, base, None, states[kind.name], li, ctx, compute_base)
        if compute_base:
            assert new is not None
            x = jax.lax.dynamic_update_slice_in_dim(x, new.x, first, 1)
        return x, {**states, kind.name: st}

    def chunks(
        carry: Any, kind: LayerKind, p: Params, li: Any, compute_base: bool, **remote: Any
    ) -> Any:
        body = lambda c, xs: run(
            xs[0], xs[1], kind, p, li, c * chunk, chunk, compute_base, **remote
        )
        return jax.lax.fori_loop(lo, hi, body, carry)

    def layer(carry: Any, kind: LayerKind, p: Params, li: Any) -> Any:
        x, states = carry
        if cfg.base_window is None:  # causal over every slot: all-gather the layer's K/V
            x, states = chunks((x, states), kind, p, li, False)
            remote = {"gathered": pseq.gathered_keys(states[kind.name], li, end)}
        elif w > 1:  # the window: the last W-1 slots of the shards before, by halo exchange
            tail = min(w - 1, ls)
            x, states = run(x, states, kind, p, li, ls - tail, tail, False)
            remote = {"halo": pseq.halo_keys(states[kind.name], li, off, w - 1, end)}
        else:
            remote = {}
        return chunks((x, states), kind, p, li, True, **remote)

    def last(carry: Any, kind: LayerKind, p: Params, li: Any) -> Any:  # base output dead: K/V only
        return chunks(carry, kind, p, li, False)

    local = cache.replace(max_len=ls)  # what the read pass sees of this shard
    x, states = stack.layer_loop(params, cfg, (x, local.states), layer, by_index=True, last=last)
    local = local.with_states(states, end)
    # Each row's last prompt token lies on one shard: broadcast what the read pass needs.
    here = end - 1 - off
    mine = (here >= 0) & (here < ls)
    at = jnp.clip(here, 0, ls - 1)
    if cfg.two_streams:
        tok = jnp.take_along_axis(tokens, at[:, None], 1)[:, 0]
        tok = jax.lax.psum(jnp.where(mine, tok, 0), SEQ)
        x0 = fwd.embed(params, tok[:, None], cfg)[:, 0]
        last_x = fwd.read_pass(
            params, cfg, local, x0, impl=impl, base=False, last_only=False, slot_offset=off
        )
    else:
        got = jnp.take_along_axis(x, at[:, None, None], 1)[:, 0]
        x_in = jax.lax.psum(jnp.where(mine[:, None], got, 0), SEQ)
        last_x = fwd.read_pass(
            params, cfg, local, x_in, impl=impl, base=True, last_only=True, slot_offset=off
        )
    return fwd.logits_of(params, last_x, cfg), local.replace(max_len=cache.max_len)


@functools.partial(jax.jit, static_argnames=("cfg", "mesh"), donate_argnames=("cache",))
def prefill(
    params: Params,
    cache: KVCache,
    tokens: jax.Array,
    lengths: jax.Array,
    *,
    cfg: ModelConfig,
    mesh: Mesh,
) -> tuple[jax.Array, KVCache]:
    """Prefill of a cache split over `mesh` (see the module docstring). tokens [B, S]: the
    prompts on the slot grid (`slot_tokens`), split like the cache's slots; lengths [B] >= 1.
    Returns (logits [B, V] at each prompt's last token, the cache split the same way)."""
    cache_spec, rows = specs(cfg, mesh, cache.batch_size, cache.max_len, kv_cache_dtype(cache))
    fn = jax.shard_map(
        functools.partial(_prefill_shard, cfg=cfg, mesh=mesh),
        mesh=mesh,
        in_specs=(P(), cache_spec, P(rows, SEQ), P(rows)),
        out_specs=(P(rows), cache_spec),
        # A Pallas kernel's outputs carry no varying-axes types (splash's prefill chunks).
        check_vma=cfg.attention_impl != "splash",
    )
    return fn(params, cache, tokens, lengths)


# ---------------------------------------------------------------- decode


def decode(
    params: Params,
    cache: KVCache,
    tokens: jax.Array,
    active: jax.Array,
    *,
    cfg: ModelConfig,
    mesh: Mesh,
) -> tuple[jax.Array, KVCache]:
    """drivers.decode on a cache split over `mesh` (traceable inside jit: generate's
    loop). tokens, active [B] -> (logits [B, V], cache split the same way)."""
    cache_spec, rows = specs(cfg, mesh, cache.batch_size, cache.max_len, kv_cache_dtype(cache))

    def shard(params: Params, cache: KVCache, tokens: jax.Array, active: jax.Array) -> Any:
        ls = cache.max_len // sequence_size(mesh)
        off = jax.lax.axis_index(SEQ) * ls
        local = cache.replace(max_len=ls)
        impl = SequenceAttention(cfg.attention_impl)
        logits, local = fwd.decode(
            params, local, tokens, active, cfg=cfg, impl=impl, slot_offset=off
        )
        return logits, local.replace(max_len=cache.max_len)

    fn = jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(P(), cache_spec, P(rows), P(rows)),
        out_specs=(P(rows), cache_spec),
    )
    return fn(params, cache, tokens, active)


decode_jit = jax.jit(decode, static_argnames=("cfg", "mesh"), donate_argnames=("cache",))
