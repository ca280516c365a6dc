"""The engine's two jitted calls (device.py) over a sequence-parallel cache: one from
init_cache(cfg, B, S, mesh=mesh) on a mesh whose "sequence" axis is > 1, each row's slots split
over that axis (rows over the batch axes, e.g. "data"); inference/sequence_parallel.py's drivers.

Shapes as device.py: B slots (cache rows), P rows prefilled in one call, T prompt tokens of each
this call (the engine's buckets), S cache slots per row, K decode steps per call.

    SequenceParallel(mesh).prefill_rows(params, cache, hist, rows, reset, tokens, lengths,
                                        sampling, pen, cfg=)
    SequenceParallel(mesh).decode_rows(params, cache, hist, tokens, budget, stops, sampling, pen,
                                       cfg=, steps=)


take and return what device.prefill_rows / decode_rows do. prefill_rows gathers and resets rows
[P] (device.gather_rows / reset_rows), lays each row's T tokens on the sub-cache's slot grid
[P, S] from the row's current length on (its length after the reset: a chunked prompt continues
where the last chunk stopped), runs sequence_parallel.prefill and scatters the rows back.
decode_rows is inference/decode_loop.py over sequence_parallel.decode. The cache in and out keeps
init_cache's sharding (a sharding constraint on each result: a changed sharding would recompile
the next call).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orthros_jax.config import ModelConfig
from orthros_jax.inference import logit_processing as lp
from orthros_jax.inference import sequence_parallel
from orthros_jax.inference.cache import KVCache, cache_shardings, kv_cache_dtype
from orthros_jax.inference.decode_loop import decode_loop
from orthros_jax.inference.sampling import RowSampling, Sampled
from orthros_jax.layers.kind import Params
from orthros_jax.parallel.sequence import SEQ, check_mesh, sequence_size
from orthros_jax.serving.device import gather_rows, reset_rows, sample_prefilled, scatter_rows


def check(cfg: ModelConfig, mesh: object, max_batch: int, max_len: int) -> None:
    """Nothing for mesh=None (one device); else ValueError (before any array or compile) unless the
    engine can serve on this mesh: a "sequence" axis > 1 and what init_cache(..., mesh=) accepts
    (max_len a multiple of the sequence size, max_batch of the batch axes, layer kinds whose cache
    grows with slots, no tensor axis). A mesh of shapes (jax.sharding.AbstractMesh) is enough."""
    if mesh is None:
        return
    shape = getattr(mesh, "shape", None)
    if not hasattr(shape, "get") or sequence_size(mesh) < 2:  # type: ignore[arg-type]
        raise ValueError(
            f"Engine: mesh must have a 'sequence' axis > 1 (got {shape}); use mesh=None to "
            "serve on one device"
        )
    check_mesh(cfg, max_batch, max_len, mesh)  # type: ignore[arg-type]


def replicated(mesh: Mesh | None) -> NamedSharding | None:
    """Where the engine puts the params: every device of the mesh (None: the default device)."""
    return None if mesh is None else NamedSharding(mesh, P())


def _constrain(cfg: ModelConfig, cache: KVCache, mesh: Mesh) -> KVCache:
    sh = cache_shardings(cfg, cache.batch_size, cache.max_len, mesh, kv_cache_dtype(cache))
    return cache.replace(
        states=jax.lax.with_sharding_constraint(cache.states, sh.states),
        lengths=jax.lax.with_sharding_constraint(cache.lengths, sh.lengths),
    )


def _replicated(hist: lp.History, mesh: Mesh) -> lp.History:
    return jax.lax.with_sharding_constraint(hist, NamedSharding(mesh, P()))


def _prefill_rows(
    params: Params,
    cache: KVCache,
    hist: lp.History,
    rows_P: jax.Array,
    reset_P: jax.Array,
    tokens_PT: jax.Array,
    lengths_P: jax.Array,
    sampling: RowSampling,
    pen: lp.Penalties,
    *,
    cfg: ModelConfig,
    mesh: Mesh,
) -> tuple[Sampled, KVCache, lp.History]:
    sub = _constrain(cfg, reset_rows(cfg, gather_rows(cfg, cache, rows_P), reset_P), mesh)
    p, t = tokens_PT.shape
    # Row j's token i at slot held_j + i (sequence_parallel.slot_tokens, on device: T ids in,
    # not S); tokens past lengths_j go to slot S, dropped.
    col = sub.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    col = jnp.where(jnp.arange(t)[None] < lengths_P[:, None], col, sub.max_len)
    grid = jnp.zeros((p, sub.max_len), jnp.int32)
    grid = grid.at[jnp.arange(p)[:, None], col].set(tokens_PT.astype(jnp.int32), mode="drop")
    _, rows = sequence_parallel.specs(cfg, mesh, p, sub.max_len)
    grid = jax.lax.with_sharding_constraint(grid, NamedSharding(mesh, P(rows, SEQ)))
    # Padding rows (id >= B) have 0 tokens: they write nothing, and are never scattered back.
    logits, sub = sequence_parallel.prefill(params, sub, grid, lengths_P, cfg=cfg, mesh=mesh)
    cache = _constrain(cfg, scatter_rows(cfg, cache, rows_P, sub), mesh)
    out, hist = sample_prefilled(logits, hist, rows_P, reset_P, tokens_PT, lengths_P, sampling, pen)
    return out, cache, _replicated(hist, mesh)


def _decode_rows(
    params: Params,
    cache: KVCache,
    hist: lp.History,
    tokens_B: jax.Array,
    budget_B: jax.Array,
    stops_BN: jax.Array,
    sampling: RowSampling,
    pen: lp.Penalties,
    *,
    cfg: ModelConfig,
    steps: int,
    mesh: Mesh,
) -> tuple[Sampled, jax.Array, KVCache, lp.History]:
    decode = functools.partial(sequence_parallel.decode, cfg=cfg, mesh=mesh)
    out = decode_loop(
        decode,
        params,
        cache,
        tokens_B,
        budget_B,
        stops_BN,
        sampling,
        steps=steps,
        vocab_size=cfg.vocab_size,
        hist=hist,
        pen=pen,
    )
    return out.sampled, out.fed, _constrain(cfg, out.cache, mesh), _replicated(out.hist, mesh)


DONATED = ("cache", "hist")
prefill_rows = jax.jit(_prefill_rows, static_argnames=("cfg", "mesh"), donate_argnames=DONATED)
decode_rows = jax.jit(
    _decode_rows, static_argnames=("cfg", "steps", "mesh"), donate_argnames=DONATED
)


class SequenceParallel:
    """device.py's prefill_rows / decode_rows (same arguments and results) on a cache split
    over `mesh` (check() it first): what the engine calls in place of the device module."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh

    def prefill_rows(self, *args: Any, cfg: ModelConfig) -> tuple[Sampled, KVCache, lp.History]:
        return prefill_rows(*args, cfg=cfg, mesh=self.mesh)

    def decode_rows(
        self, *args: Any, cfg: ModelConfig, steps: int
    ) -> tuple[Sampled, jax.Array, KVCache, lp.History]:
        return decode_rows(*args, cfg=cfg, steps=steps, mesh=self.mesh)


def compile_count() -> int:
    """Compiled variants of both sequence-parallel calls (device.compile_count's twin)."""
    return prefill_rows._cache_size() + decode_rows._cache_size()  # type: ignore[attr-defined]
