"""Inference API: prefill, decode_step and generate over an explicit KVCache.

Shapes: B batch, T prompt tokens, S cache slots, M new tokens, V vocab.

    cache = init_cache(cfg, batch_size, max_len)
    logits, cache = prefill(params, cache, tokens, lengths, cfg)   # tokens [B, T] right-padded
    logits, cache = decode_step(params, cache, next_tokens, cfg)   # next_tokens [B]
    out = generate(params, prompts, cfg, max_new_tokens=..., sampler=..., rng=...)

params is OrthrosLM's unboxed params dict (model.init_params); cfg the static ModelConfig.
These functions validate their inputs on the host (ValueError, before any compile), pad
prompts to a length bucket, then call the jitted functions of drivers.py with the
config static and the cache donated (do not reuse a cache passed in). `generate` runs the
whole decode loop on device in one jit: decode_loop.py, the serving engine's loop, with
sampling.py's per-row sampler (row b seeded from rng and b alone).

A cache made with init_cache(..., mesh=mesh) on a mesh with a "sequence" axis > 1
(pmesh.sequence_mesh) has its slots split over that axis: prefill, decode_step and
generate(mesh=mesh) then run sequence-parallel (inference/sequence_parallel.py) and return a cache
split the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from orthros_jax.config import ModelConfig
from orthros_jax.inference import drivers as fwd
from orthros_jax.inference import sequence_parallel as sp_forward
from orthros_jax.inference.cache import KVCache, check_cache, init_cache
from orthros_jax.inference.decode_loop import decode_loop
from orthros_jax.inference.sampling import Sampler, first_draw
from orthros_jax.inference.speculative import SpecStats, Speculative
from orthros_jax.inference.speculative import check as check_speculative
from orthros_jax.inference.speculative import generate_jit as speculative_jit
from orthros_jax.model import Params
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel.sequence import SEQ


def prompt_bucket(length: int, cfg: ModelConfig) -> int:
    """Padded prompt length: a power of two (>= 8) up to the chunk size, then a multiple of it.

    All prompts of one bucket share one compiled prefill.
    """
    chunk = cfg.prefill_chunk
    if length <= chunk:
        return min(chunk, max(8, 1 << (length - 1).bit_length()))
    return -(-length // chunk) * chunk


# ---------------------------------------------------------------- host-side validation


def _int_array(x: Any, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != ndim or not (
        arr.dtype.kind in "iu" or (arr.size == 0 and arr.dtype.kind == "f")
    ):
        raise ValueError(
            f"{name} must be a {ndim}-D integer array, got shape {arr.shape} {arr.dtype}"
        )
    return arr.astype(np.int64)


def _check_ids(ids: np.ndarray, cfg: ModelConfig, what: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
        bad = ids[(ids < 0) | (ids >= cfg.vocab_size)][0]
        raise ValueError(
            f"{what} contains token id {int(bad)}; ids must be in [0, vocab_size={cfg.vocab_size})"
        )


def _host(x: jax.Array) -> np.ndarray:
    """A device array on the host, also when other processes hold some of its shards."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _check_cache(cache: KVCache, cfg: ModelConfig) -> np.ndarray:
    check_cache(cache, cfg)
    return _host(cache.lengths).astype(np.int64)


def prefill(
    params: Params, cache: KVCache, tokens: Any, lengths: Any, cfg: ModelConfig
) -> tuple[jax.Array, KVCache]:
    """Prefills right-padded prompts tokens [B, T] of lengths [B] (each >= 1) into the cache.

    Rows continue after whatever the cache already holds (cache.lengths, usually 0).
    Returns the logits [B, V] (float32) that predict the token after each prompt, and the
    cache with lengths += lengths. The cache argument is donated: do not reuse it.
    """
    toks = _int_array(tokens, "prefill: tokens", 2)
    lens = _int_array(lengths, "prefill: lengths", 1)
    held = _check_cache(cache, cfg)
    bsz = cache.batch_size
    if toks.shape[0] != bsz or lens.shape[0] != bsz:
        raise ValueError(
            f"prefill: tokens {toks.shape} and lengths {lens.shape} must both have the cache's "
            f"batch size {bsz} rows"
        )
    if lens.min() < 1:
        raise ValueError(
            f"prefill: empty prompt in row {int(np.argmin(lens))}; every prompt needs >= 1 token"
        )
    if lens.max() > toks.shape[1]:
        raise ValueError(
            f"prefill: lengths up to {lens.max()} exceed the {toks.shape[1]} tokens given"
        )
    if (held + lens).max() > cache.max_len:
        row = int(np.argmax(held + lens))
        raise ValueError(
            f"prefill: row {row} needs {held[row] + lens[row]} cache slots ({held[row]} held + "
            f"{lens[row]} prompt tokens) but the cache has max_len={cache.max_len}"
        )
    valid = np.arange(toks.shape[1])[None] < lens[:, None]
    _check_ids(toks[valid], cfg, "prefill: tokens")
    mesh = sp_forward.mesh_of(cache)
    if mesh is not None:  # the prompts on the slot grid, split like the cache's slots
        slots = sp_forward.slot_tokens(toks, lens, held, cache.max_len)
        _, rows = sp_forward.specs(cfg, mesh, bsz, cache.max_len)
        return sp_forward.prefill(
            params,
            cache,
            pmesh.put(slots, NamedSharding(mesh, P(rows, SEQ))),
            pmesh.put(lens.astype(np.int32), NamedSharding(mesh, P(rows))),
            cfg=cfg,
            mesh=mesh,
        )
    t_pad = prompt_bucket(int(lens.max()), cfg)
    padded = np.zeros((bsz, t_pad), np.int32)  # padding is 0: never an invalid id on device
    width = min(t_pad, toks.shape[1])
    padded[:, :width] = np.where(valid, toks, 0)[:, :width]
    return fwd.prefill_jit(
        params, cache, jnp.asarray(padded), jnp.asarray(lens, jnp.int32), cfg=cfg
    )


def decode_step(
    params: Params, cache: KVCache, tokens: Any, cfg: ModelConfig
) -> tuple[jax.Array, KVCache]:
    """Feeds one token per row (tokens [B], at position cache.lengths) and returns the logits
    [B, V] for the next one. Each row writes its K/V at its own length. The cache is donated.

    Validation reads tokens and cache.lengths back to the host (one small sync per step);
    `generate` runs its loop on device without it.
    """
    toks = _int_array(tokens, "decode_step: tokens", 1)
    held = _check_cache(cache, cfg)
    if toks.shape[0] != cache.batch_size:
        raise ValueError(f"decode_step: tokens {toks.shape} must have {cache.batch_size} rows")
    _check_ids(toks, cfg, "decode_step: tokens")
    if held.max() >= cache.max_len:
        raise ValueError(
            f"decode_step: row {int(np.argmax(held))} is full (max_len={cache.max_len}); "
            "use a larger cache (init_cache(..., max_len=...))"
        )
    mesh = sp_forward.mesh_of(cache)
    if mesh is not None:
        _, rows = sp_forward.specs(cfg, mesh, cache.batch_size, cache.max_len)
        on_rows = lambda a: pmesh.put(a, NamedSharding(mesh, P(rows)))
        return sp_forward.decode_jit(
            params,
            cache,
            on_rows(toks.astype(np.int32)),
            on_rows(np.ones((cache.batch_size,), bool)),
            cfg=cfg,
            mesh=mesh,
        )
    active = jnp.ones((cache.batch_size,), bool)
    return fwd.decode_jit(params, cache, jnp.asarray(toks, jnp.int32), active, cfg=cfg)


# ---------------------------------------------------------------- generation loop


class GenerateOutput(flax.struct.PyTreeNode):
    """tokens [B, M] (the stop token included, -1 after the end), lengths [B] (tokens
    generated per row), hit_capacity [B] (row stopped because its cache was full), logprobs
    [B, M] float32 (each token's log-prob under the distribution the sampler drew it from:
    0 for greedy, 0 after the end); speculation: generate(speculative=...)'s per-row
    speculative.SpecStats (host arrays; None without speculation)."""

    tokens: np.ndarray
    lengths: np.ndarray
    hit_capacity: np.ndarray
    logprobs: np.ndarray
    speculation: SpecStats | None = None


def _generate_loop(
    params: Params,
    cache: KVCache,
    logits: jax.Array,
    rng: jax.Array,
    stops: jax.Array,
    *,
    cfg: ModelConfig,
    sampler: Sampler,
    max_new_tokens: int,
    mesh: Mesh | None,
) -> Any:
    """Samples the first token from the prefill's logits, then decode_loop (the serving
    engine's) for the rest, every row with `sampler` and its own seed from rng.
    mesh: the mesh of a sequence-split cache (None: the single-program decode)."""
    rows, first, budget = first_draw(logits, rng, sampler, stops, max_new_tokens)
    out = decode_loop(
        sp_forward.decoder(cfg, mesh),
        params,
        cache,
        first.tokens,
        budget,
        stops,
        rows.replace(step=rows.step + 1),
        steps=max_new_tokens - 1,
        vocab_size=cfg.vocab_size,
        logprobs=False,
    )
    column = lambda x, rest, pad: jnp.concatenate([x[:, None], jnp.where(out.fed, rest, pad).T], 1)
    tokens = column(first.tokens, out.sampled.tokens, -1)
    logprobs = column(first.sample_logprob, out.sampled.sample_logprob, 0.0)
    num = 1 + out.fed.sum(axis=0, dtype=jnp.int32)
    return tokens, num, out.hit_capacity, logprobs, out.cache


_generate_jit = jax.jit(
    _generate_loop,
    static_argnames=("cfg", "sampler", "max_new_tokens", "mesh"),
    donate_argnames=("cache",),
)


def generate(
    params: Params,
    prompts: Sequence[Sequence[int]],
    cfg: ModelConfig,
    *,
    max_new_tokens: int,
    sampler: Sampler | None = None,
    rng: jax.Array | None = None,
    stop_tokens: Sequence[int] | Sequence[Sequence[int]] = (),
    cache_size: int | None = None,
    mesh: Mesh | None = None,
    kv_cache_dtype: str | None = None,
    speculative: Speculative | None = None,
) -> GenerateOutput:
    """Generates up to max_new_tokens per prompt (a list of B token-id lists, ragged).

    sampler: a sampling.Sampler (default greedy); rng: its PRNG key (default PRNGKey(0)); row
    b draws with the seed sampling.row_seeds(rng, B)[b] (from rng and b alone).
    stop_tokens: ids that end a row (emitted, then the row stops), shared by all rows or one
    list per row. cache_size: slots per row (default: longest prompt + max_new_tokens, rounded
    up to 128, and to a multiple of the mesh's sequence axis). A row that fills its cache stops
    there with hit_capacity set; nothing wraps. mesh: split the cache over it (init_cache's
    mesh; a "sequence" axis > 1 runs prefill and the decode loop sequence-parallel).
    kv_cache_dtype: "int8" / "fp8" store the K/V quantized (init_cache's; None: full precision).
    speculative: a speculative.Speculative(k, draft_window): self-speculative decoding, the
    same tokens (greedy) or the same distribution (sampling) in fewer passes over the cache.
    """
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        prompts = list(prompts)
    if not prompts or any(np.ndim(p) != 1 for p in prompts):
        raise ValueError("generate: prompts must be a non-empty list of token-id lists")
    if (
        not isinstance(max_new_tokens, int)
        or isinstance(max_new_tokens, bool)
        or max_new_tokens < 1
    ):
        raise ValueError(f"generate: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    lens = np.array([len(p) for p in prompts], np.int64)
    if lens.min() < 1:
        raise ValueError(f"generate: prompt {int(np.argmin(lens))} is empty; each needs >= 1 token")
    unit = math.lcm(128, sp_forward.sequence_size(mesh))
    size = cache_size or -(-(int(lens.max()) + max_new_tokens) // unit) * unit
    if lens.max() > size:
        raise ValueError(
            f"generate: prompt {int(np.argmax(lens))} has {lens.max()} tokens but cache_size={size}"
        )
    tokens = np.zeros((len(prompts), int(lens.max())), np.int64)
    for i, p in enumerate(prompts):
        ids = _int_array(p, f"generate: prompt {i}", 1) if len(p) else np.zeros(0, np.int64)
        tokens[i, : len(ids)] = ids
    _check_ids(tokens, cfg, "generate: prompts")
    stops = _stop_table(stop_tokens, len(prompts), cfg)
    if speculative is not None:
        if not isinstance(speculative, Speculative):
            raise ValueError(f"generate: speculative must be a Speculative, got {speculative!r}")
        check_speculative(speculative, cfg, size, sp_forward.sequence_size(mesh) > 1)
    cache = init_cache(cfg, len(prompts), size, mesh=mesh, kv_cache_dtype=kv_cache_dtype)
    logits, cache = prefill(params, cache, tokens, lens, cfg)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    loop, how = (  # the plain decode loop, or speculation's rounds (+ their statistics)
        (_generate_jit, dict(mesh=sp_forward.mesh_of(cache)))
        if speculative is None
        else (speculative_jit, dict(spec=speculative))
    )
    out, num, hit, logprobs, _, *stats = loop(
        params,
        cache,
        logits,
        rng,
        jnp.asarray(stops),
        cfg=cfg,
        sampler=sampler or Sampler(),
        max_new_tokens=max_new_tokens,
        **how,
    )
    speculation = jax.tree.map(_host, stats[0]) if stats else None
    return GenerateOutput(_host(out), _host(num), _host(hit), _host(logprobs), speculation)


def _stop_table(stop_tokens: Any, bsz: int, cfg: ModelConfig) -> np.ndarray:
    """Stop ids as [B, n] int32, padded with -1 (no sampled token is negative)."""
    rows = list(stop_tokens)
    if rows and all(np.ndim(r) == 1 for r in rows):
        if len(rows) != bsz:
            raise ValueError(f"generate: {len(rows)} per-row stop lists for {bsz} prompts")
    elif all(np.ndim(r) == 0 for r in rows):
        rows = [rows] * bsz
    else:
        raise ValueError("generate: stop_tokens must be a list of ids or one list of ids per row")
    width = max(1, max(len(r) for r in rows))
    table = np.full((bsz, width), -1, np.int64)
    for i, r in enumerate(rows):
        ids = np.asarray(r, np.int64).reshape(-1)
        _check_ids(ids, cfg, "generate: stop_tokens")
        table[i, : len(ids)] = ids
    return table.astype(np.int32)
