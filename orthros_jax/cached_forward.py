"""The cached forward pass: chunked prefill and one-token decode over a KVCache (jitted, pure).

Shapes: B batch, T prompt tokens (padded to a bucket), C prefill chunk, S cache slots,
L layers, N query heads, K kv heads, G = N/K, H head_dim, D d_model, V vocab, W window.

Composed from model.py's per-layer pure functions (`layer_kv`, `layer_query`,
`layer_finish`), so it computes exactly what the training forward computes:
  orthros      base stream: sliding window, writes the K/V of every layer; its last layer's
               attention/FFN output is dead and skipped. Output stream: one token per row,
               global over the whole cache of each layer; it writes nothing.
  transformer  one stream, global over the cache; logits at each row's last token.
  swa          one stream, sliding window; logits at each row's last token.
Positions are cache slots (kv_cache.py), so masks compare slot indices.
Input validation lives in inference.py; these functions assume valid inputs.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from orthros_jax import kv_cache as kvc
from orthros_jax import layers as L
from orthros_jax.attention import KEY_PAD_SEGMENT, global_attention, local_attention
from orthros_jax.config import ModelConfig
from orthros_jax.kv_cache import KVCache
from orthros_jax.model import Params, layer_finish, layer_kv, layer_query

_MASKED = -1e30  # finite, as in attention.py: a row with no visible key stays finite


def embed(params: Params, tokens: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Token ids [B, T] -> [B, T, D] in the activation dtype."""
    return L.embed(tokens, params["embedding"], cfg.jnp_dtype)


def logits_of(params: Params, x_BD: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Final norm + LM head on one hidden state per row: [B, D] -> float32 [B, V]."""
    head = params["embedding"].T if cfg.tie_embeddings else params["lm_head"]
    h = L.rms_norm(x_BD[:, None], params["final_norm"], cfg.norm_eps)
    return L.lm_logits(h, head)[:, 0]


def for_layers(body, carry, params: Params, cfg: ModelConfig, last_body=None):
    """carry = body(carry, layer_params, l) for every layer l, or `last_body` for the last one.

    A loop over layer indices (one traced layer: fast compiles) that reads each layer out of the
    whole stack, then the last layer on its own. Neither slicing the stack (a[:L-1] copies 3/4
    of the weights on every call) nor a lax.cond on the layer index (its branches copy the
    carried cache) is used: both were measured to dominate the orthros decode step. A
    `last_body` that writes the cache made decode copy the whole cache (see `decode`, which
    uses none); chunked prefill keeps one, as the in-loop alternative (a lax.cond skipping the
    last layer's dead work) measured slower there (bench config, 16K: 2.24 s vs 1.95 s).
    With cfg.scan_layers=False the loop is unrolled.
    """
    stack = params["layers"]
    n = cfg.n_layers
    head = n if last_body is None else n - 1

    def layer_at(li):
        return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, li, keepdims=False), stack)

    if cfg.scan_layers and head > 0:
        carry = jax.lax.fori_loop(0, head, lambda li, c: body(c, layer_at(li), li), carry)
    else:
        for i in range(head):
            carry = body(carry, layer_at(i), i)
    if last_body is not None:
        carry = last_body(carry, layer_at(n - 1), n - 1)
    return carry


def _last_layer(params: Params, cfg: ModelConfig) -> Params:
    return jax.tree.map(lambda a: a[cfg.n_layers - 1], params["layers"])


def attend_cached(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
    """A few queries per row over head-major keys: q [B, Q, N, H]; k, v [B, K, S', H];
    visible [B, Q, S'] bool. Returns [B, Q, N, H]. Softmax in float32, as in attention.py."""
    bsz, nq, n, h = q.shape
    kv = k.shape[1]
    qg = q.reshape(bsz, nq, kv, n // kv, h)
    s = jnp.einsum("bqkgh,bksh->bkgqs", qg, k, preferred_element_type=jnp.float32)
    s = jnp.where(visible[:, None, None], s / math.sqrt(h), _MASKED)
    p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    # Output kept as [B, K, G, Q, H] then transposed (small): XLA:CPU has no bf16 x bf16 -> f32
    # dot for the "bqkgh" output order.
    out = jnp.einsum("bkgqs,bksh->bkgqh", p, v, preferred_element_type=jnp.float32)
    return jnp.moveaxis(out, 3, 1).reshape(bsz, nq, n, h).astype(q.dtype)


def output_stream(params: Params, cache: KVCache, tokens_B: jax.Array, cfg: ModelConfig):
    """The orthros output stream of the token at slot lengths-1 of each row, through all
    layers over the full cache (slots < lengths): hidden state [B, D]."""
    pos = cache.lengths - 1
    visible = (jnp.arange(cache.max_len)[None] < cache.lengths[:, None])[:, None]  # [B, 1, S]

    def body(x, p, li):
        q = layer_query(p, x, pos[:, None], cfg, "out")
        k, v = kvc.layer_view(cache.k, li), kvc.layer_view(cache.v, li)
        attn = attend_cached(q, k, v, visible)
        return layer_finish(p, x, attn, cfg)

    return for_layers(body, embed(params, tokens_B[:, None], cfg), params, cfg)[:, 0]


# ---------------------------------------------------------------- prefill


def prefill(params: Params, cache: KVCache, tokens: jax.Array, lengths: jax.Array, *, cfg):
    """Right-padded prompts tokens [B, T] (T <= C or a multiple of C), lengths [B] >= 1, written
    after each row's cache.lengths. Returns (logits [B, V] at each prompt's last token, cache).

    The prompt runs in chunks of C tokens (a lax.scan); each chunk's base stream reads its
    previous W-1 keys back from the cache, so memory is the cache plus O(C * D) activations.
    """
    bsz, t = tokens.shape
    chunk = min(cfg.prefill_chunk, t)
    s, w = cache.max_len, cfg.window
    start = cache.lengths  # rows may already hold a prefix (continued prefill)
    end = start + lengths
    slot_ids = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (bsz, s))
    slot_seg = jnp.where(slot_ids < end[:, None], 1, KEY_PAD_SEGMENT)

    def run_chunk(carry, c):
        ck, cv, last_x = carry
        off = c * chunk + jnp.arange(chunk, dtype=jnp.int32)  # [C] offsets into the prompt
        pos = start[:, None] + off  # [B, C] positions = slots
        slots = jnp.where(off < lengths[:, None], pos, s)  # padding -> slot S: dropped
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
                # Written first, so the chunk's own keys are read back with all earlier ones;
                # the head-major cache layer is read in place, block by block.
                attn = global_attention(
                    q, kvc.layer_view(ck, li), kvc.layer_view(cv, li), q_positions=pos,
                    k_positions=slot_ids, k_segment_ids=slot_seg,
                    block_q=cfg.attention_block_q, block_k=cfg.attention_block_k,
                    kv_head_major=True,
                )  # fmt: skip
            else:
                prefix = None
                if w > 1:
                    pk, pv = (jnp.swapaxes(kvc.read(a, li, pre), 1, 2) for a in (ck, cv))
                    prefix = (pk, pv, pre, pre_seg)
                attn = local_attention(
                    q,
                    k,
                    v,
                    q_positions=pos,
                    k_positions=pos,
                    window=w,
                    prefix=prefix,
                    block_size=cfg.attention_block_local,
                )
            return layer_finish(p, x, attn, cfg), ck, cv

        x = embed(params, jax.lax.dynamic_slice_in_dim(tokens, c * chunk, chunk, 1), cfg)
        # Every arm reads only the last token's output: the last layer writes K/V for the
        # chunk and runs its attention/FFN for that one token after the scan.
        kv_only = lambda carry, p, li: layer(carry, p, li, compute_base=False)
        x, ck, cv = for_layers(layer, (x, ck, cv), params, cfg, last_body=kv_only)
        if not cfg.two_streams:  # keep each row's last prompt token at the last layer's input
            idx = lengths - 1 - c * chunk
            here = (idx >= 0) & (idx < chunk)
            got = jnp.take_along_axis(x, jnp.clip(idx, 0, chunk - 1)[:, None, None], axis=1)
            last_x = jnp.where(here[:, None], got[:, 0], last_x)
        return (ck, cv, last_x), None

    last_x = jnp.zeros((bsz, cfg.d_model), cfg.jnp_dtype)
    chunks = jnp.arange(t // chunk, dtype=jnp.int32)
    (ck, cv, last_x), _ = jax.lax.scan(run_chunk, (cache.k, cache.v, last_x), chunks)
    cache = KVCache(ck, cv, end)
    if cfg.two_streams:  # the output stream runs once, after every layer's cache is filled
        last_tok = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]
        last_x = output_stream(params, cache, last_tok, cfg)
    else:
        last_x = _last_token_last_layer(params, cache, last_x, cfg)
    return logits_of(params, last_x, cfg), cache


def _last_token_last_layer(params: Params, cache: KVCache, x_BD: jax.Array, cfg: ModelConfig):
    """Single-stream arms: the last layer for each row's last prompt token (slot lengths-1),
    whose K/V of every slot are already in the cache. Returns its output [B, D]."""
    li = cfg.n_layers - 1
    p = _last_layer(params, cfg)
    pos = cache.lengths - 1
    slots = jnp.arange(cache.max_len)[None]
    visible = slots <= pos[:, None]
    if cfg.architecture == "swa":
        visible &= slots > pos[:, None] - cfg.window
    q = layer_query(p, x_BD[:, None], pos[:, None], cfg, "base")
    k, v = kvc.layer_view(cache.k, li), kvc.layer_view(cache.v, li)
    attn = attend_cached(q, k, v, visible[:, None])
    return layer_finish(p, x_BD[:, None], attn, cfg)[:, 0]


# ---------------------------------------------------------------- decode


def decode(params: Params, cache: KVCache, tokens: jax.Array, active: jax.Array, *, cfg):
    """tokens [B] at position cache.lengths -> (logits [B, V] for the next token, cache).

    Each row writes its K/V at its own length. Rows with active=False write nothing and keep
    their length (their logits are garbage): `generate` uses this for rows that stopped.
    """
    s = cache.max_len
    wn = min(cfg.window, s)  # positions are < S: a longer window reads nothing more
    pos = cache.lengths  # [B]
    slots = jnp.where(active, pos, s)[:, None]  # inactive -> slot S: dropped
    win = pos[:, None] - (wn - 1) + jnp.arange(wn, dtype=jnp.int32)  # [B, W], itself last
    visible_all = (jnp.arange(s)[None] <= pos[:, None])[:, None]  # [B, 1, S]

    def layer(carry, p, li):
        x, x_out, ck, cv = carry
        k, v = layer_kv(p, x, pos[:, None], cfg)
        ck, cv = kvc.write(ck, li, slots, k), kvc.write(cv, li, slots, v)
        q = layer_query(p, x, pos[:, None], cfg, "base")
        if cfg.architecture == "transformer":
            kf, vf = kvc.layer_view(ck, li), kvc.layer_view(cv, li)
            return layer_finish(p, x, attend_cached(q, kf, vf, visible_all), cfg), x_out, ck, cv
        # The sliding-window stream (swa, orthros base) reads only its last W slots: O(W).
        kw, vw = kvc.read(ck, li, win), kvc.read(cv, li, win)
        attn = attend_cached(q, kw, vw, (win >= 0)[:, None])
        if not cfg.two_streams:
            return layer_finish(p, x, attn, cfg), x_out, ck, cv
        # Orthros: the output copy reads every slot up to its own position. W_O and the FFN
        # are token-wise and shared: both streams go through them as one [B, 2, D] batch.
        q_out = layer_query(p, x_out, pos[:, None], cfg, "out")
        kf, vf = kvc.layer_view(ck, li), kvc.layer_view(cv, li)
        attn_out = attend_cached(q_out, kf, vf, visible_all)
        both = layer_finish(
            p, jnp.concatenate([x, x_out], 1), jnp.concatenate([attn, attn_out], 1), cfg
        )
        return both[:, :1], both[:, 1:], ck, cv

    x = embed(params, tokens[:, None], cfg)
    # Every layer runs inside one loop, the last included although its base output is dead:
    # a cache write after the layer loop made XLA copy the whole cache on every step (bench
    # config at 16K: Orthros decode 2.0x the Transformer's, now 1.1x; README "Performance"),
    # while the dead base costs one token's window attention and FFN.
    x, x_out, ck, cv = for_layers(layer, (x, x, cache.k, cache.v), params, cfg)
    final = x_out if cfg.two_streams else x
    return logits_of(params, final[:, 0], cfg), KVCache(ck, cv, pos + active.astype(jnp.int32))


prefill_jit = jax.jit(prefill, static_argnames=("cfg",), donate_argnames=("cache",))
decode_jit = jax.jit(decode, static_argnames=("cfg",), donate_argnames=("cache",))
