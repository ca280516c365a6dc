"""The engine's two jitted calls over one KVCache whose rows are the engine's slots.

Shapes: B slots (cache rows), P rows prefilled in one call (a bucket <= B), T prompt tokens
of each of them this call (a bucket), S cache slots per row, V vocab.

    prefill_rows(params, cache, hist, rows, reset, tokens, lengths, sampling, pen, cfg=, mesh=)
        -> (Sampled, cache, hist)
    decode_rows(params, cache, hist, tokens, budget, stops, sampling, pen, cfg=, steps=K, mesh=)
        -> (Sampled [K, B], fed [K, B], cache, hist)
    spec_decode_rows(... the same ..., cfg=, steps=R, spec=)
        -> (Sampled [K, B], fed [K, B], cache, hist, SpecStats), K = R * (spec.k + 1)


prefill_rows gathers rows [P] of the cache (every leaf along the axis its kind's `state_axes`
names BATCH, lengths along 0), resets those with reset=True to an empty row (length 0 and
each kind's init_state: a new request's row, GDN recurrent state included), continues their
prefill with inference/drivers.prefill (tokens [P, T] right-padded, lengths [P] >= 0: a row with
0 tokens keeps its state and length) and scatters them back. Row ids >= B are padding:
gathered clipped, never written back (mode='drop'), so no row outside `rows` changes.
decode_rows runs inference/decode_loop.py (generate's loop: at most K steps, K static) over
inference/drivers.decode on every row, each feeding the token the step before sampled: row b
runs while it has budget[b] steps left and has not sampled one of its stop ids (stops [B, N],
-1 padded); other rows write nothing (fed[k, b] says which ran). K > 1 trades streaming
granularity for one host round trip per K tokens (vLLM's multi-step scheduling). Both process
each row's logits (hist / pen: penalties, logit bias, min_tokens; inference/logit_processing.py),
sample per row (inference/sampling.sample_rows; the key of a draw is the row's seed and its token
count, so K does not change what is drawn; Sampled.sample_logprob is each token's log-prob
under the distribution it was drawn from) and donate the cache and the history.

mesh: None for a cache on one device; else the mesh of init_cache(cfg, B, S, mesh=mesh), whose
"sequence" axis (> 1; buckets.check_mesh) splits every row's slots: the drivers run
sequence-parallel (inference/sequence_parallel.py; prefill_rows lays each row's T tokens on the
sub-cache's slot grid [P, S] from the row's length after the reset on), and the cache in and out
keeps init_cache's sharding (a changed sharding would recompile the next call).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orthros_jax.axes import BATCH
from orthros_jax.config import ModelConfig
from orthros_jax.inference import drivers as fwd
from orthros_jax.inference import logit_processing as lp
from orthros_jax.inference import sequence_parallel, speculative
from orthros_jax.inference.cache import (
    KVCache,
    cache_shardings,
    kind_states,
    kv_cache_dtype,
    leaf_axes,
)
from orthros_jax.inference.decode_loop import decode_loop
from orthros_jax.inference.sampling import RowSampling, Sampled, sample_rows
from orthros_jax.layers.kind import Params
from orthros_jax.layers.registry import KINDS
from orthros_jax.parallel.sequence import SEQ


def _is_axes(x: Any) -> bool:
    return isinstance(x, tuple) and bool(x) and all(a is None or isinstance(a, str) for a in x)


def batch_axes(cfg: ModelConfig, cache: KVCache) -> dict[str, Any]:
    """The BATCH axis index of every leaf of cache.states, a pytree like it."""
    return {
        name: jax.tree.map(
            lambda ax: ax.index(BATCH),
            leaf_axes(KINDS[name].state_axes(cfg), cache.states[name]),
            is_leaf=_is_axes,
        )
        for name in cache.states
    }


def _index(axis: int, rows: jax.Array) -> tuple:
    # One advanced index at `axis`: the result keeps the axis in place (no transpose).
    return (slice(None),) * axis + (rows,)


def gather_rows(cfg: ModelConfig, cache: KVCache, rows_P: jax.Array) -> KVCache:
    """The sub-cache of rows [P] (ids >= B clipped to B-1: padding reads some row)."""
    take = lambda a, ax: jnp.take(a, rows_P, axis=ax, mode="clip")
    states = jax.tree.map(take, cache.states, batch_axes(cfg, cache))
    return cache.replace(states=states, lengths=take(cache.lengths, 0))


def scatter_rows(cfg: ModelConfig, cache: KVCache, rows_P: jax.Array, sub: KVCache) -> KVCache:
    """cache with rows [P] replaced by sub's rows; ids >= B are dropped."""
    put = lambda a, ax, x: a.at[_index(ax, rows_P)].set(x, mode="drop")
    states = jax.tree.map(put, cache.states, batch_axes(cfg, cache), sub.states)
    return cache.replace(states=states, lengths=put(cache.lengths, 0, sub.lengths))


def reset_rows(cfg: ModelConfig, cache: KVCache, reset_B: jax.Array) -> KVCache:
    """cache with every row where reset is True emptied: length 0, each kind's initial state."""
    fresh = kind_states(cfg, cache.batch_size, cache.max_len, cfg.jnp_dtype, kv_cache_dtype(cache))

    def pick(a: jax.Array, ax: int, new: jax.Array) -> jax.Array:
        shape = [1] * a.ndim
        shape[ax] = a.shape[ax]
        return jnp.where(reset_B.reshape(shape), new.astype(a.dtype), a)

    states = jax.tree.map(pick, cache.states, batch_axes(cfg, cache), fresh)
    return cache.replace(states=states, lengths=jnp.where(reset_B, 0, cache.lengths))


def sample_prefilled(
    logits_PV: jax.Array,
    hist: lp.History,
    rows_P: jax.Array,
    reset_P: jax.Array,
    tokens_PT: jax.Array,
    lengths_P: jax.Array,
    sampling: RowSampling,
    pen: lp.Penalties,
) -> tuple[Sampled, lp.History]:
    """The first tokens of prefilled rows [P] under their penalties; hist with the chunk's
    prompt tokens recorded (reset rows emptied first)."""
    sub = lp.record_prompt(lp.gather(hist, rows_P), tokens_PT, lengths_P, reset_P)
    out = sample_rows(lp.apply(logits_PV, sub, pen, sampling.step), sampling)
    return out, lp.scatter(hist, rows_P, sub)


def replicated(mesh: Mesh | None) -> NamedSharding | None:
    """Where the engine puts the params and the history: every device of the mesh (None: the
    default device)."""
    return None if mesh is None else NamedSharding(mesh, P())


def _placed(cfg: ModelConfig, cache: KVCache, mesh: Mesh | None) -> KVCache:
    """cache constrained to init_cache's sharding on mesh (a changed sharding would recompile
    the next call); as it is on one device."""
    if mesh is None:
        return cache
    sh = cache_shardings(cfg, cache.batch_size, cache.max_len, mesh, kv_cache_dtype(cache))
    return cache.replace(
        states=jax.lax.with_sharding_constraint(cache.states, sh.states),
        lengths=jax.lax.with_sharding_constraint(cache.lengths, sh.lengths),
    )


def _placed_hist(hist: lp.History, mesh: Mesh | None) -> lp.History:
    return hist if mesh is None else jax.lax.with_sharding_constraint(hist, replicated(mesh))


def _slot_grid(
    cfg: ModelConfig, mesh: Mesh, sub: KVCache, tokens_PT: jax.Array, lengths_P: jax.Array
) -> jax.Array:
    """[P, S] tokens on the sub-cache's slot grid, split like its slots: row j's token i at
    slot sub.lengths[j] + i (sequence_parallel.slot_tokens on device: T ids in, not S); tokens
    past lengths_P[j] go to slot S, dropped."""
    p, t = tokens_PT.shape
    col = sub.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    col = jnp.where(jnp.arange(t)[None] < lengths_P[:, None], col, sub.max_len)
    grid = jnp.zeros((p, sub.max_len), jnp.int32)
    grid = grid.at[jnp.arange(p)[:, None], col].set(tokens_PT.astype(jnp.int32), mode="drop")
    _, rows = sequence_parallel.specs(cfg, mesh, p, sub.max_len)
    return jax.lax.with_sharding_constraint(grid, NamedSharding(mesh, P(rows, SEQ)))


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
    mesh: Mesh | None = None,
) -> tuple[Sampled, KVCache, lp.History]:
    sub = _placed(cfg, reset_rows(cfg, gather_rows(cfg, cache, rows_P), reset_P), mesh)
    if mesh is None:
        logits, sub = fwd.prefill(params, sub, tokens_PT, lengths_P, cfg=cfg)
    else:  # padding rows (id >= B) have 0 tokens: they write nothing, and are never scattered
        grid = _slot_grid(cfg, mesh, sub, tokens_PT, lengths_P)
        logits, sub = sequence_parallel.prefill(params, sub, grid, lengths_P, cfg=cfg, mesh=mesh)
    cache = _placed(cfg, scatter_rows(cfg, cache, rows_P, sub), mesh)
    out, hist = sample_prefilled(logits, hist, rows_P, reset_P, tokens_PT, lengths_P, sampling, pen)
    return out, cache, _placed_hist(hist, mesh)


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
    mesh: Mesh | None = None,
) -> tuple[Sampled, jax.Array, KVCache, lp.History]:
    out = decode_loop(
        sequence_parallel.decoder(cfg, mesh),
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
    return out.sampled, out.fed, _placed(cfg, out.cache, mesh), _placed_hist(out.hist, mesh)


def _spec_decode_rows(
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
    spec: speculative.Speculative,
) -> tuple[Sampled, jax.Array, KVCache, lp.History, speculative.SpecStats]:
    """decode_rows under speculation: `steps` rounds of inference/speculative.decode_rounds
    (the same logit processing and log-probs), laid out as decode_rows' (Sampled [K, B, ...],
    fed [K, B]) with K = steps * (k + 1) tokens."""
    out, emitted, cache, hist, stats = speculative.decode_rounds(
        params,
        cache,
        tokens_B,
        budget_B,
        stops_BN,
        sampling,
        hist,
        pen,
        cfg=cfg,
        spec=spec,
        rounds=steps,
    )
    fed = jnp.arange(out.tokens.shape[1])[:, None] < emitted[None, :]
    return jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), out), fed, cache, hist, stats


DONATED = ("cache", "hist")
prefill_rows = jax.jit(_prefill_rows, static_argnames=("cfg", "mesh"), donate_argnames=DONATED)
decode_rows = jax.jit(
    _decode_rows, static_argnames=("cfg", "steps", "mesh"), donate_argnames=DONATED
)


spec_decode_rows = jax.jit(
    _spec_decode_rows, static_argnames=("cfg", "steps", "spec"), donate_argnames=DONATED
)


def compile_count() -> int:
    """Compiled variants of the calls (tests check it stays put in steady state)."""
    calls = (prefill_rows, decode_rows, spec_decode_rows)
    return sum(c._cache_size() for c in calls)  # type: ignore[attr-defined]
