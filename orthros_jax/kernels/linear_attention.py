"""Parameter-free math of gated linear attention: a chunked form over a sequence and the
one-token recurrent step, for a decay per key dim (GLA) or per head (RetNet, simple GLA).

Shapes: B batch, L sequence, N heads (keys/values already repeated to the query heads),
H key head dim, E value head dim, C chunk, c sub-chunk (the README's H is the key dim here;
E has no letter there). The recurrence, per head, with row vectors and state S [H, E]:
    S_t = diag(exp g_t) S_{t-1} + k_t^T v_t,     o_t = scale * q_t S_t
with g_t [H] (per key dim) or a scalar broadcast over H (per head), g <= 0 (log decay).
A *reset* before token t means S_{t-1} := 0 (a new packed document); a token with k = 0 and
g = 0 leaves S unchanged (padding). Everything runs in float32, the state included.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

f32 = jnp.float32


def _chunks(x: jax.Array, n: int, c: int) -> jax.Array:
    """[B, n*C, ...] -> [n, B, C, ...] (chunk-major, so a scan walks the chunks)."""
    return jnp.moveaxis(x.reshape(x.shape[0], n, c, *x.shape[2:]), 1, 0)


def _between(c: int) -> jax.Array:
    """M [C(t), C(i), C(j)] = 1 where j < t <= i: sum_t g_t M_tij = G_i - G_j as a sum of
    same-signed terms (a difference of two cumulative sums would cancel: at |G| ~ 1000 that
    loses 1e-4 of every decay factor in float32)."""
    r = jnp.arange(c)
    t, i, j = r[:, None, None], r[None, :, None], r[None, None, :]
    return ((j < t) & (t <= i)).astype(f32)


def _masked_exp(x: jax.Array, mask: jax.Array) -> jax.Array:
    """exp(x) where mask, else 0 (exp of -inf: no overflow from the masked-out entries)."""
    return jnp.exp(jnp.where(mask, x, -jnp.inf))


def _scores_per_head(q: jax.Array, k: jax.Array, g: jax.Array, mask: jax.Array) -> jax.Array:
    """Intra-chunk scores A_ij = (q_i . k_j) exp(G_i - G_j) for a per-head decay.

    q, k [n, B, C, N, H]; g [n, B, C, N] log decays; mask [n, B, 1, C, C] (j <= i, same
    document). Returns [n, B, N, C, C]."""
    diff = jnp.einsum("zbtn,tij->zbnij", g, _between(g.shape[2]))
    return jnp.einsum("zbinh,zbjnh->zbnij", q, k) * _masked_exp(diff, mask)


def _scores_per_key(
    q: jax.Array, k: jax.Array, g: jax.Array, mask: jax.Array, sub: int
) -> jax.Array:
    """Intra-chunk scores A_ij = sum_h q_ih k_jh exp(G_ih - G_jh) for a per-key-dim decay, with
    no factor above 1 anywhere (so no overflow however strong the decay, and underflow only
    where the product itself is below float32's range).

    The chunk is cut into sub-chunks of `sub` tokens. For j in an earlier sub-chunk than i,
    exp(G_i - G_j) = exp(G_i - R) exp(R - G_j) with R the cumulative decay just before i's
    sub-chunk: both exponents are <= 0, and the block is one matmul. Inside a sub-chunk the
    decay is taken pair by pair ([sub, sub, H] per sub-chunk). q, k, g [n, B, C, N, H];
    mask as in _scores_per_head. Returns [n, B, N, C, C]."""
    c = q.shape[2]
    m = c // sub
    split = lambda x: x.reshape(x.shape[0], x.shape[1], m, sub, *x.shape[3:])
    q_s, k_s, g_s = split(q), split(k), split(g)  # [n, B, m, sub, N, H]
    q_in = q_s * jnp.exp(jnp.cumsum(g_s, axis=3))  # decay from i's sub-chunk start to i
    # decay from just after j to the end of j's sub-chunk, then over the whole sub-chunks
    # between j's and i's: exponents of one sign, summed (no cancellation).
    rev = jnp.cumsum(g_s[:, :, :, ::-1], axis=3)[:, :, :, ::-1]
    to_end = jnp.concatenate([rev[:, :, :, 1:], jnp.zeros_like(rev[:, :, :, :1])], axis=3)
    total = rev[:, :, :, 0]  # [n, B, m, N, H]
    a_, b_, x_ = jnp.arange(m)[:, None, None], jnp.arange(m)[None, :, None], jnp.arange(m)
    gap = jnp.einsum("zyxnh,apx->zyapnh", total, ((b_ < x_) & (x_ < a_)).astype(f32))
    expo = to_end[:, :, None] + gap[:, :, :, :, None]  # [n, B, m(a), m(b), sub(j), N, H]
    earlier = (jnp.arange(m)[None, :] < jnp.arange(m)[:, None])[:, :, None, None, None]
    k_rel = k_s[:, :, None] * _masked_exp(expo, earlier)
    k_rel = k_rel.reshape(*k_rel.shape[:3], c, *k_rel.shape[5:])  # [n, B, m(a), C(j), N, H]
    off = jnp.einsum("zbaihd,zbajhd->zbhaij", q_in, k_rel).reshape(*q.shape[:2], -1, c, c)
    pair = jnp.einsum("zbatnh,tij->zbaijnh", g_s, _between(sub))
    tri = jnp.tril(jnp.ones((sub, sub), bool))[:, :, None, None]
    diag = jnp.einsum("zbaihd,zbajhd,zbaijhd->zbhaij", q_s, k_s, _masked_exp(pair, tri))
    eye = jnp.eye(m, dtype=f32)
    diag = jnp.einsum("zbhaij,ae->zbhaiej", diag, eye).reshape(off.shape)
    return jnp.where(mask, off + diag, 0.0)


def chunked_linear_attention(
    queries: tuple[jax.Array, ...],
    k_BLNH: jax.Array,
    v_BLNE: jax.Array,
    g: jax.Array,
    reset_BL: jax.Array,
    state_BNHE: jax.Array,
    *,
    scale: float,
    chunk: int = 64,
    sub_chunk: int = 16,
) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """The gated linear-attention recurrence over a sequence in chunks (O(L*C) work), float32.

    queries: one or more [B, L, N, H]; each reads the state after its own token,
    o_t = scale * q_t S_t. k [B, L, N, H], v [B, L, N, E]; g the log decay (<= 0), [B, L, N, H]
    (per key dim) or [B, L, N] (per head); reset [B, L] (state zeroed before the token);
    initial state [B, N, H, E]. Any L and any chunk give the token-by-token result (chunk
    padding is k = g = 0). sub_chunk (per-key-dim decay only) must divide chunk (it is capped
    at chunk). Returns (one output [B, L, N, E] per query, final state [B, N, H, E] float32).

    Within a chunk, with G the inclusive cumulative decay from the chunk's start,
        o_i = scale * (q_i exp(G_i)) S_0 + scale * sum_{j<=i} A_ij v_j,
        S_C = diag(exp G_C) S_0 + sum_j (k_j exp(G_C - G_j))^T v_j,
    with A_ij = q_i diag(exp(G_i - G_j)) k_j^T; a reset inside the chunk cuts both sums at
    it (segment masks) and drops S_0 after it.
    """
    b, seq, nh, hk = k_BLNH.shape
    e = v_BLNE.shape[-1]
    per_key = g.ndim == 4
    if g.shape[:3] != (b, seq, nh) or (per_key and g.shape[3] != hk) or g.ndim not in (3, 4):
        raise ValueError(f"g must be [B, L, N] or [B, L, N, H] = {(b, seq, nh, hk)}, got {g.shape}")
    c = chunk
    sub = min(sub_chunk, c)
    if per_key and c % sub:
        raise ValueError(f"sub_chunk={sub_chunk} must divide chunk={chunk}")
    pad = (-seq) % c
    n = (seq + pad) // c

    def prep(x: jax.Array) -> jax.Array:
        x = jnp.pad(x.astype(f32), [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return _chunks(x, n, c)

    qs = [prep(q) * scale for q in queries]  # [n, B, C, N, H]
    k, v = prep(k_BLNH), prep(v_BLNE)
    gg = prep(g if per_key else g[..., None])  # [n, B, C, N, H or 1]
    reset = _chunks(jnp.pad(reset_BL.astype(jnp.int32), [(0, 0), (0, pad)]), n, c)
    seg = jnp.cumsum(reset, axis=2)  # [n, B, C]: document index inside the chunk

    same = seg[..., :, None] == seg[..., None, :]
    mask = (same & jnp.tril(jnp.ones((c, c), bool)))[:, :, None]  # [n, B, 1, C, C]
    if per_key:
        scores = [_scores_per_key(q, k, gg, mask, sub) for q in qs]
    else:
        scores = [_scores_per_head(q, k, gg[..., 0], mask) for q in qs]
    intra = [jnp.einsum("zbhij,zbjhe->zbihe", a, v) for a in scores]  # [n, B, C, N, E]

    cum = jnp.cumsum(gg, axis=2)  # decay from the chunk's start through each token
    rev = jnp.cumsum(gg[:, :, ::-1], axis=2)[:, :, ::-1]
    after = jnp.concatenate([rev[:, :, 1:], jnp.zeros_like(rev[:, :, :1])], axis=2)
    from_state = (seg == 0)[..., None, None]  # token still sees S_0 (no reset before it)
    q_decayed = [jnp.where(from_state, q * jnp.exp(cum), 0.0) for q in qs]
    last = seg[:, :, -1:]
    k_end = jnp.where((seg == last)[..., None, None], k * jnp.exp(after), 0.0)
    chunk_decay = jnp.where((last[:, :, 0] == 0)[..., None, None], jnp.exp(cum[:, :, -1]), 0.0)

    def step(s: jax.Array, xs: Any) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        qd_c, intra_c, k_end_c, v_c, decay_c = xs
        outs = tuple(
            jnp.einsum("bcnh,bnhe->bcne", qd, s) + it for qd, it in zip(qd_c, intra_c, strict=True)
        )
        s = decay_c[..., None] * s + jnp.einsum("bcnh,bcne->bnhe", k_end_c, v_c)
        return s, outs

    final, outs = jax.lax.scan(
        step, state_BNHE.astype(f32), (tuple(q_decayed), tuple(intra), k_end, v, chunk_decay)
    )
    # [n, B, C, N, E] -> [B, L, N, E]
    outs = tuple(jnp.moveaxis(o, 0, 1).reshape(b, n * c, nh, e)[:, :seq] for o in outs)
    return outs, final


def linear_attention_step(
    queries: tuple[jax.Array, ...],
    k_BNH: jax.Array,
    v_BNE: jax.Array,
    g: jax.Array,
    active_B: jax.Array,
    state_BNHE: jax.Array,
    *,
    scale: float,
) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """One token of the recurrence in float32 (decode): S = diag(exp g) S + k^T v, then each
    query [B, N, H] reads o = scale * q S. g: [B, N, H] (per key dim) or [B, N] (per head).
    Inactive rows keep their state. Returns (outputs [B, N, E], state [B, N, H, E])."""
    g = g.astype(f32)
    decay = jnp.exp(g)[..., None] if g.ndim == 3 else jnp.exp(g)[..., None, None]
    s_old = state_BNHE.astype(f32)
    s = decay * s_old + k_BNH.astype(f32)[..., :, None] * v_BNE.astype(f32)[..., None, :]
    outs = tuple(jnp.einsum("bnh,bnhe->bne", q.astype(f32) * scale, s) for q in queries)
    return outs, jnp.where(active_B[:, None, None, None], s, s_old)


def linear_attention_step_stacked(
    queries: tuple[jax.Array, ...],
    k_BNH: jax.Array,
    v_BNE: jax.Array,
    g: jax.Array,
    active_B: jax.Array,
    stack: jax.Array,
    li: jax.Array | int,
    *,
    scale: float,
) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """linear_attention_step on entry li of a stacked state [layers, B, N, H, E] (float32),
    written in place: the update is elementwise in the old state, so XLA fuses its read into
    the in-place write, and the queries read the new state after the write. (A matmul reading
    the old state before the write makes XLA copy the whole stack, every layer.) Returns
    (outputs [B, N, E], the stack)."""
    g = g.astype(f32)
    decay = jnp.exp(g)[..., None] if g.ndim == 3 else jnp.exp(g)[..., None, None]
    s_old = jax.lax.dynamic_index_in_dim(stack, li, keepdims=False)
    s = decay * s_old + k_BNH.astype(f32)[..., :, None] * v_BNE.astype(f32)[..., None, :]
    s = jnp.where(active_B[:, None, None, None], s, s_old)
    stack = jax.lax.dynamic_update_index_in_dim(stack, s.astype(stack.dtype), li, 0)
    s = jax.lax.dynamic_index_in_dim(stack, li, keepdims=False)
    outs = tuple(jnp.einsum("bnh,bnhe->bne", q.astype(f32) * scale, s) for q in queries)
    return outs, stack
