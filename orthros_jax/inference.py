"""Cached inference: chunked prefill, one-token decode and a jitted generation loop.

Shapes: B batch, T prompt tokens (padded), C prefill chunk, S cache slots, L layers,
N query heads, K kv heads, H head_dim, D d_model, V vocab, W window.

All three architectures share one code path, composed from model.py's per-layer pure
functions (`layer_kv`, `layer_query`, `layer_finish`):
  orthros      base stream: sliding window over the cache (writes K/V of every layer);
               output stream: one token per row, global over the whole cache of each layer.
  transformer  one stream, global over the cache; logits from its last-position hidden state.
  swa          one stream, sliding window; logits from its last-position hidden state.
Slot s of the cache holds position s (see kv_cache.py), so masks compare slot indices.

`prefill`, `decode_step` and `generate` validate their inputs on the host (ValueError, before
any compile) and then call jitted functions with the config static and the cache donated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from orthros_jax import kv_cache as kvc
from orthros_jax import layers as L
from orthros_jax.attention import KEY_PAD_SEGMENT, global_attention, local_attention
from orthros_jax.config import ModelConfig
from orthros_jax.kv_cache import KVCache, init_cache
from orthros_jax.model import Params, layer_finish, layer_kv, layer_query
from orthros_jax.sampling import Sampler, sample

__all__ = [
    "GenerateOutput",
    "KVCache",
    "Sampler",
    "decode_step",
    "generate",
    "init_cache",
    "prefill",
    "prompt_bucket",
]

# ---------------------------------------------------------------- shared pieces


def _embed(params: Params, tokens: jax.Array, cfg: ModelConfig) -> jax.Array:
    return L.embed(tokens, params["embedding"], cfg.jnp_dtype)


def _logits(params: Params, x_BD: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Final norm + LM head on one hidden state per row: [B, D] -> float32 [B, V]."""
    head = params["embedding"].T if cfg.tie_embeddings else params["lm_head"]
    h = L.rms_norm(x_BD[:, None], params["final_norm"], cfg.norm_eps)
    return L.lm_logits(h, head)[:, 0]


def _for_layers(body, carry, params: Params, cfg: ModelConfig, n_layers: int, first: int = 0):
    """carry = body(carry, layer_params, l) over layers first..first+n_layers-1.

    A lax.scan (one traced layer, fast compiles) or, with cfg.scan_layers=False, a Python loop.
    """
    if n_layers <= 0:
        return carry
    stack = jax.tree.map(lambda a: a[first : first + n_layers], params["layers"])
    if cfg.scan_layers:
        idx = jnp.arange(first, first + n_layers, dtype=jnp.int32)
        carry, _ = jax.lax.scan(lambda c, xs: (body(c, xs[0], xs[1]), None), carry, (stack, idx))
        return carry
    for i in range(n_layers):
        carry = body(carry, jax.tree.map(lambda a, i=i: a[i], stack), first + i)
    return carry


def _attend_all(q: jax.Array, ck: jax.Array, cv: jax.Array, layer, q_pos_B, end_B) -> jax.Array:
    """Global attention of one query per row [B, 1, N, H] over a whole cache layer (slots < end)."""
    s = ck.shape[2]
    slots = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (q.shape[0], s))
    seg = jnp.where(slots < end_B[:, None], 1, KEY_PAD_SEGMENT)
    return global_attention(
        q,
        kvc.layer_view(ck, layer),
        kvc.layer_view(cv, layer),
        q_positions=q_pos_B[:, None],
        k_positions=slots,
        k_segment_ids=seg,
    )


def _output_stream(params, ck, cv, tokens_B, pos_B, end_B, cfg: ModelConfig) -> jax.Array:
    """The orthros output stream for one token per row at pos_B, all layers: [B, D].

    It only reads the cache (the base K/V of each layer), never writes it.
    """

    def body(x, p, layer):
        q = layer_query(p, x, pos_B[:, None], cfg, "out")
        return layer_finish(p, x, _attend_all(q, ck, cv, layer, pos_B, end_B), cfg)

    x = _embed(params, tokens_B[:, None], cfg)
    return _for_layers(body, x, params, cfg, cfg.n_layers)[:, 0]


# ---------------------------------------------------------------- prefill


def prompt_bucket(length: int, cfg: ModelConfig) -> int:
    """Padded prompt length: a power of two (>= 8) up to the chunk size, then a multiple of it.

    All prompts of one bucket share one compiled prefill.
    """
    chunk = cfg.prefill_chunk
    if length <= chunk:
        return min(chunk, max(8, 1 << (length - 1).bit_length()))
    return -(-length // chunk) * chunk


def _prefill_impl(params: Params, cache: KVCache, tokens: jax.Array, lengths: jax.Array, *, cfg):
    """tokens [B, T] (T a bucket: <= C, or a multiple of C), lengths [B] >= 1 -> ([B, V], cache)."""
    bsz, t = tokens.shape
    chunk = min(cfg.prefill_chunk, t)
    s, w = cache.max_len, cfg.window
    start = cache.lengths  # rows may already hold a prefix (continued prefill)
    end = start + lengths
    n_full = cfg.n_layers - 1 if cfg.two_streams else cfg.n_layers  # orthros: last base is dead

    def run_chunk(carry, c):
        ck, cv, last_x = carry
        off = c * chunk + jnp.arange(chunk, dtype=jnp.int32)  # [C] offsets into the prompt
        pos = start[:, None] + off  # [B, C] positions = cache slots
        slots = jnp.where(off < lengths[:, None], pos, s)  # padding -> slot S: dropped
        # The chunk's previous window (W-1 slots before its first token) comes from the cache.
        pre = pos[:, :1] - (w - 1) + jnp.arange(w - 1, dtype=jnp.int32)  # [B, W-1]
        pre_seg = jnp.where(pre >= 0, 1, KEY_PAD_SEGMENT)

        def layer(carry, p, li, compute_base=True):
            x, ck, cv = carry
            k, v = layer_kv(p, x, pos, cfg)
            ck, cv = kvc.write(ck, li, slots, k), kvc.write(cv, li, slots, v)
            if not compute_base:
                return x, ck, cv
            q = layer_query(p, x, pos, cfg, "base")
            if cfg.architecture == "transformer":
                # Written first, so the chunk's own keys are read back from the cache.
                s_ids = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (bsz, s))
                attn = global_attention(
                    q,
                    kvc.layer_view(ck, li),
                    kvc.layer_view(cv, li),
                    q_positions=pos,
                    k_positions=s_ids,
                    k_segment_ids=jnp.where(s_ids < end[:, None], 1, -1),
                    block_q=cfg.attention_block_q,
                    block_k=cfg.attention_block_k,
                )
            else:
                prefix = None
                if w > 1:
                    prefix = (kvc.gather(ck, li, pre), kvc.gather(cv, li, pre), pre, pre_seg)
                attn = local_attention(
                    q, k, v, q_positions=pos, k_positions=pos, window=w, prefix=prefix
                )
            return layer_finish(p, x, attn, cfg), ck, cv

        carry = (
            _embed(params, jax.lax.dynamic_slice_in_dim(tokens, c * chunk, chunk, 1), cfg),
            ck,
            cv,
        )
        carry = _for_layers(layer, carry, params, cfg, n_full)
        if cfg.two_streams:
            last = jax.tree.map(lambda a: a[cfg.n_layers - 1], params["layers"])
            carry = layer(carry, last, cfg.n_layers - 1, compute_base=False)
        x, ck, cv = carry
        if not cfg.two_streams:  # keep the hidden state of each row's last prompt token
            idx = lengths - 1 - c * chunk
            here = (idx >= 0) & (idx < chunk)
            got = jnp.take_along_axis(x, jnp.clip(idx, 0, chunk - 1)[:, None, None], axis=1)
            last_x = jnp.where(here[:, None], got[:, 0], last_x)
        return (ck, cv, last_x), None

    last_x = jnp.zeros((bsz, cfg.d_model), cfg.jnp_dtype)
    (ck, cv, last_x), _ = jax.lax.scan(
        run_chunk, (cache.k, cache.v, last_x), jnp.arange(t // chunk, dtype=jnp.int32)
    )
    if cfg.two_streams:  # the output stream runs once, after every layer's cache is full
        last_tok = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
        last_x = _output_stream(params, ck, cv, last_tok, end - 1, end, cfg)
    return _logits(params, last_x, cfg), KVCache(ck, cv, end)


_prefill_jit = jax.jit(_prefill_impl, static_argnames=("cfg",), donate_argnames=("cache",))


# ---------------------------------------------------------------- decode


def _decode_impl(params: Params, cache: KVCache, tokens: jax.Array, active: jax.Array, *, cfg):
    """tokens [B] at position cache.lengths; rows with active=False write nothing and keep
    their length (their logits are garbage). Returns (logits [B, V], cache)."""
    s = cache.max_len
    wn = min(cfg.window, s)  # positions are < S, so a longer window reads nothing more
    pos = cache.lengths  # [B]
    end = pos + 1
    slots = jnp.where(active, pos, s)[:, None]  # inactive -> slot S: dropped
    win = pos[:, None] - (wn - 1) + jnp.arange(wn, dtype=jnp.int32)  # [B, W], itself last
    win_seg = jnp.where(win >= 0, 1, KEY_PAD_SEGMENT)

    def layer(carry, p, li, compute_base=True):
        x, x_out, ck, cv = carry
        k, v = layer_kv(p, x, pos[:, None], cfg)
        ck, cv = kvc.write(ck, li, slots, k), kvc.write(cv, li, slots, v)
        if compute_base:
            q = layer_query(p, x, pos[:, None], cfg, "base")
            if cfg.architecture == "transformer":
                attn = _attend_all(q, ck, cv, li, pos, end)
            else:  # only the last W slots: O(W) per step whatever the history
                attn = global_attention(
                    q,
                    kvc.gather(ck, li, win),
                    kvc.gather(cv, li, win),
                    q_positions=pos[:, None],
                    k_positions=win,
                    k_segment_ids=win_seg,
                )
            x = layer_finish(p, x, attn, cfg)
        if cfg.two_streams:
            q = layer_query(p, x_out, pos[:, None], cfg, "out")
            attn = _attend_all(q, ck, cv, li, pos, end)
            x_out = layer_finish(p, x_out, attn, cfg)
        return x, x_out, ck, cv

    x = _embed(params, tokens[:, None], cfg)
    carry = (x, x, cache.k, cache.v)  # the output copy starts from the same embedding
    n_full = cfg.n_layers - 1 if cfg.two_streams else cfg.n_layers
    carry = _for_layers(layer, carry, params, cfg, n_full)
    if cfg.two_streams:
        last = jax.tree.map(lambda a: a[cfg.n_layers - 1], params["layers"])
        carry = layer(carry, last, cfg.n_layers - 1, compute_base=False)
    x, x_out, ck, cv = carry
    final = x_out if cfg.two_streams else x
    lengths = pos + active.astype(jnp.int32)
    return _logits(params, final[:, 0], cfg), KVCache(ck, cv, lengths)


_decode_jit = jax.jit(_decode_impl, static_argnames=("cfg",), donate_argnames=("cache",))


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


def _check_cache(cache: KVCache, cfg: ModelConfig) -> np.ndarray:
    want = (cfg.n_layers, cache.batch_size, cache.max_len, cfg.n_kv_heads, cfg.head_dim)
    if cache.k.shape != want or cache.v.shape != want:
        raise ValueError(f"cache k/v have shape {cache.k.shape}; this config needs {want}")
    return np.asarray(cache.lengths).astype(np.int64)


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
    t_pad = prompt_bucket(int(lens.max()), cfg)
    padded = np.zeros((bsz, t_pad), np.int32)  # padding is 0: never an invalid id on device
    width = min(t_pad, toks.shape[1])
    padded[:, :width] = np.where(valid, toks, 0)[:, :width]
    return _prefill_jit(params, cache, jnp.asarray(padded), jnp.asarray(lens, jnp.int32), cfg=cfg)


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
    active = jnp.ones((cache.batch_size,), bool)
    return _decode_jit(params, cache, jnp.asarray(toks, jnp.int32), active, cfg=cfg)


# ---------------------------------------------------------------- generation loop


@flax.struct.dataclass
class _LoopState:
    cache: KVCache
    tokens: jax.Array  # [B, M] generated ids, -1 after a row stopped
    last: jax.Array  # [B] the token to feed next
    num: jax.Array  # [B] tokens generated
    done: jax.Array  # [B] bool
    hit_capacity: jax.Array  # [B] bool: stopped because the cache was full
    step: jax.Array  # () tokens emitted so far (columns of `tokens` written)
    rng: jax.Array


@flax.struct.dataclass
class GenerateOutput:
    """tokens [B, M] (the stop token included, -1 after the end), lengths [B] (tokens
    generated per row), hit_capacity [B] (row stopped because its cache was full)."""

    tokens: np.ndarray
    lengths: np.ndarray
    hit_capacity: np.ndarray


def _generate_loop(params, cache, logits, rng, stops, *, cfg, sampler, max_new_tokens):
    """The decode loop in one jit: sample, stop rows that emitted a stop token, feed the rest."""
    bsz, s = cache.batch_size, cache.max_len

    def emit(st: _LoopState, logits: jax.Array, live: jax.Array) -> _LoopState:
        tok = sample(logits, jax.random.fold_in(st.rng, st.step), sampler)
        stopped = (tok[:, None] == stops).any(axis=-1)
        return st.replace(
            tokens=st.tokens.at[:, st.step].set(jnp.where(live, tok, -1)),
            last=jnp.where(live, tok, 0),
            num=st.num + live.astype(jnp.int32),
            done=st.done | ~live | stopped,
            step=st.step + 1,
        )

    def body(st: _LoopState) -> _LoopState:
        full = st.cache.lengths >= s  # no slot left for the token to feed
        active = ~st.done & ~full
        logits, cache = _decode_impl(params, st.cache, st.last, active, cfg=cfg)
        st = st.replace(cache=cache, hit_capacity=st.hit_capacity | (~st.done & full))
        return emit(st, logits, active)

    st = _LoopState(
        cache=cache,
        tokens=jnp.full((bsz, max_new_tokens), -1, jnp.int32),
        last=jnp.zeros((bsz,), jnp.int32),
        num=jnp.zeros((bsz,), jnp.int32),
        done=jnp.zeros((bsz,), bool),
        hit_capacity=jnp.zeros((bsz,), bool),
        step=jnp.zeros((), jnp.int32),
        rng=rng,
    )
    st = emit(st, logits, jnp.ones((bsz,), bool))
    st = jax.lax.while_loop(lambda st: (st.step < max_new_tokens) & ~st.done.all(), body, st)
    return st.tokens, st.num, st.hit_capacity, st.cache


_generate_jit = jax.jit(
    _generate_loop, static_argnames=("cfg", "sampler", "max_new_tokens"), donate_argnames=("cache",)
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
) -> GenerateOutput:
    """Generates up to max_new_tokens per prompt (a list of B token-id lists, ragged).

    sampler: a sampling.Sampler (default greedy); rng: its PRNG key (default PRNGKey(0)).
    stop_tokens: ids that end a row (emitted, then the row stops), shared by all rows or one
    list per row. cache_size: slots per row (default: longest prompt + max_new_tokens, rounded
    up to 128). A row that fills its cache stops there with hit_capacity set; nothing wraps.
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
    size = cache_size or -(-(int(lens.max()) + max_new_tokens) // 128) * 128
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
    cache = init_cache(cfg, len(prompts), size)
    logits, cache = prefill(params, cache, tokens, lens, cfg)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    out, num, hit, _ = _generate_jit(
        params,
        cache,
        logits,
        rng,
        jnp.asarray(stops),
        cfg=cfg,
        sampler=sampler,
        max_new_tokens=max_new_tokens,
    )
    return GenerateOutput(np.asarray(out), np.asarray(num), np.asarray(hit))


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
