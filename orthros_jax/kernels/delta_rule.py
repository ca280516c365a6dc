"""Parameter-free math of the gated DeltaNet (GDN) token mixer: causal depthwise conv over a
masked sequence, the chunked gated delta rule, and its single-token step.

Shapes: B batch, L sequence, C channels (conv) or chunk length (delta rule), J = kernel - 1
conv history slots, H value heads (q/k already repeated to them), dk key dim, dv value dim.

The gated delta rule, per head, with row vectors and state S [dk, dv]:
    S_t = a_t S_{t-1} + beta_t k_t^T (v_t - a_t k_t S_{t-1}),   a_t = exp(g_t),   o_t = q_t S_t
A *reset* before token t means S_{t-1} := 0 (a new packed document); a token with beta = 0
and g = 0 leaves S unchanged (padding).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x * rsqrt(sum(x^2) + eps) over the last axis (FLA / transformers' eps convention)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_conv(
    x_BLC: jax.Array,
    w_KC: jax.Array,
    hist_BJC: jax.Array,
    valid_BL: jax.Array,
    doc_BL: jax.Array,
    bias_C: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Depthwise causal conv (+ bias_C [C] before the activation, Mamba-2's conv1d bias) +
    SiLU that skips padding and never crosses documents.

    Token t (valid) sees the K-1 previous *valid* inputs of its own document (doc_BL equal),
    reaching into hist_BJC (the previous call's last J = K-1 valid inputs, document 0) when t is
    in document 0. Weight convention of torch's conv1d: w[K-1] multiplies the token itself.
    Returns (y_BLC in x's dtype, zero where invalid; new history [B, J, C]: the last J valid
    inputs of the final document, zeros where that document has fewer).
    """
    b, seq, c = x_BLC.shape
    k = w_KC.shape[0]
    j = k - 1
    # Compact the valid tokens (in order) behind the history, so a lag is a plain shift whatever
    # the padding pattern; invalid tokens are scattered out of range and dropped.
    rank_BL = jnp.cumsum(valid_BL, axis=1) - 1
    dest_BL = jnp.where(valid_BL, j + rank_BL, j + seq)
    ext = jnp.concatenate([hist_BJC.astype(x_BLC.dtype), jnp.zeros_like(x_BLC)], axis=1)
    ext_doc = jnp.concatenate(
        [jnp.zeros((b, j), jnp.int32), jnp.full((b, seq), -1, jnp.int32)], axis=1
    )
    scatter = jax.vmap(lambda dst, idx, val: dst.at[idx].set(val, mode="drop"))
    ext = scatter(ext, dest_BL, x_BLC)
    ext_doc = scatter(ext_doc, dest_BL, doc_BL.astype(jnp.int32))

    tgt_doc = ext_doc[:, j:]
    acc = jnp.zeros((b, seq, c), jnp.float32)
    w32 = w_KC.astype(jnp.float32)
    for lag in range(k):
        src = ext[:, j - lag : j - lag + seq].astype(jnp.float32)
        same = (ext_doc[:, j - lag : j - lag + seq] == tgt_doc)[..., None]
        acc = acc + jnp.where(same, src * w32[k - 1 - lag], 0.0)
    if bias_C is not None:
        acc = acc + bias_C.astype(jnp.float32)
    y_compact = jax.nn.silu(acc).astype(x_BLC.dtype)
    y = jnp.take_along_axis(y_compact, jnp.maximum(rank_BL, 0)[..., None], axis=1)
    y = jnp.where(valid_BL[..., None], y, 0)

    n_B = jnp.sum(valid_BL, axis=1)
    take = jax.vmap(lambda e, n: jax.lax.dynamic_slice_in_dim(e, n, j, axis=0))
    new_hist = take(ext, n_B)
    last_doc_B = jnp.max(jnp.where(valid_BL, doc_BL, 0), axis=1)
    keep = take(ext_doc, n_B) == last_doc_B[:, None]
    return y, jnp.where(keep[..., None], new_hist, 0).astype(hist_BJC.dtype)


def conv_step(
    x_BC: jax.Array,
    w_KC: jax.Array,
    hist_BJC: jax.Array,
    active_B: jax.Array,
    bias_C: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One token of causal_conv: y_BC = silu(sum_k w[k] window[k] (+ bias_C)) over the window
    (history, token); the history shifts only for active rows. Returns (y_BC, new history
    [B, J, C])."""
    window = jnp.concatenate([hist_BJC.astype(x_BC.dtype), x_BC[:, None]], axis=1)
    acc = jnp.einsum("bkc,kc->bc", window.astype(jnp.float32), w_KC.astype(jnp.float32))
    if bias_C is not None:
        acc = acc + bias_C.astype(jnp.float32)
    new_hist = jnp.where(active_B[:, None, None], window[:, 1:].astype(hist_BJC.dtype), hist_BJC)
    return jax.nn.silu(acc).astype(x_BC.dtype), new_hist


def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """(I + a)^-1 for strictly lower-triangular a [..., C, C], by doubling: the inverse of
    [[M11, 0], [M21, M22]] is [[T11, 0], [-T22 M21 T11, T22]] with T = inverse of the diagonal
    blocks, so log2(C) levels of batched matmuls (blocked forward substitution), rather than
    triangular_solve (docs/performance.md, "Unit-lower-triangular inverse by doubling")."""
    c = a.shape[-1]
    p = 1 << (c - 1).bit_length()  # pad to a power of two with identity rows
    if p != c:
        a = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, p - c), (0, p - c)])
    lead = a.shape[:-2]
    t = jnp.ones((*lead, p, 1, 1), a.dtype)  # inverses of the 1x1 diagonal blocks
    s = 1
    while s < p:
        m = p // (2 * s)
        blocks = jnp.diagonal(a.reshape(*lead, m, 2, s, m, 2, s), axis1=-6, axis2=-3)
        a21 = jnp.moveaxis(blocks[..., 1, :, 0, :, :], -1, -3)  # [..., m, s, s]
        t11, t22 = t[..., 0::2, :, :], t[..., 1::2, :, :]
        lower = jnp.concatenate([-t22 @ a21 @ t11, t22], axis=-1)
        upper = jnp.concatenate([t11, jnp.zeros_like(t11)], axis=-1)
        t = jnp.concatenate([upper, lower], axis=-2)
        s *= 2
    return t[..., 0, :c, :c]


def _to_chunks(x: jax.Array, n: int, c: int) -> jax.Array:
    """[B, L, H, ...] -> [n, B, H, C, ...]: chunk-major so a scan walks the chunks."""
    b, _, h = x.shape[:3]
    x = x.reshape(b, n, c, h, *x.shape[3:])
    return jnp.moveaxis(jnp.moveaxis(x, 3, 2), 1, 0)


def chunked_delta_rule(
    queries: tuple[jax.Array, ...],
    k_BLHK: jax.Array,
    v_BLHV: jax.Array,
    beta_BLH: jax.Array,
    g_BLH: jax.Array,
    reset_BL: jax.Array,
    state_BHKV: jax.Array,
    chunk: int,
) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """The gated delta rule over a sequence in chunks of `chunk` (O(L*C) work), in float32.

    queries: one or more [B, L, H, dk] (already L2-normalised and scaled); each reads the state
    after its own token, o_t = q_t S_t. k [B, L, H, dk] (normalised), v [B, L, H, dv], beta/g
    [B, L, H] (g <= 0, log decay), reset [B, L] (state zeroed before the token), initial state
    [B, H, dk, dv]. Any L: padded inside with beta = g = 0 tokens, which leave S unchanged.
    Returns (one output [B, L, H, dv] per query, final state [B, H, dk, dv]).

    Within a chunk, S_i = gamma_i S_0 + sum_{j<=i} (gamma_i/gamma_j) k_j^T u_j with gamma the
    cumulative decay; the pseudo-values u solve the unit-lower-triangular system
    (I + A) U = beta V - beta gamma K S_0, A_ij = beta_i (gamma_i/gamma_j) k_i.k_j (j < i).
    A reset inside the chunk zeroes gamma_i/gamma_j across it (segment masks below).
    """
    f32 = jnp.float32
    b, seq, h, dk = k_BLHK.shape
    dv = v_BLHV.shape[-1]
    c = chunk
    pad = (-seq) % c
    n = (seq + pad) // c

    def prep(x: jax.Array) -> jax.Array:
        x = jnp.pad(x.astype(f32), [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return _to_chunks(x, n, c)

    qs = [prep(q) for q in queries]  # [n, B, H, C, dk]
    k, v = prep(k_BLHK), prep(v_BLHV)
    beta, g = prep(beta_BLH), prep(g_BLH)  # [n, B, H, C]
    reset = jnp.pad(reset_BL, [(0, 0), (0, pad)]).reshape(b, n, c)
    seg = jnp.moveaxis(jnp.cumsum(reset, axis=2), 1, 0)[:, :, None]  # [n, B, 1, C]

    cum = jnp.cumsum(g, axis=-1)
    same_seg = seg[..., :, None] == seg[..., None, :]
    causal = jnp.tril(jnp.ones((c, c), bool))
    # exp of a masked difference: never exp of a positive number, so no overflow.
    diff = cum[..., :, None] - cum[..., None, :]
    decay_incl = jnp.exp(jnp.where(causal & same_seg, diff, -jnp.inf))  # [n, B, H, C, C]
    decay_strict = decay_incl * (1.0 - jnp.eye(c, dtype=f32))
    from_state = seg == 0  # token i still sees S_0 (no reset in the chunk up to i)
    gamma = jnp.where(from_state, jnp.exp(cum), 0.0)

    a = beta[..., :, None] * jnp.einsum("nbhik,nbhjk->nbhij", k, k) * decay_strict
    rhs = jnp.concatenate([beta[..., None] * v, (beta * gamma)[..., None] * k], axis=-1)
    solved = unit_lower_inverse(a) @ rhs
    u, w = solved[..., :dv], solved[..., dv:]

    q_gamma = [q * gamma[..., None] for q in qs]
    q_k = [jnp.einsum("nbhik,nbhjk->nbhij", q, k) * decay_incl for q in qs]
    last_seg = seg[..., -1:]
    to_end = jnp.where(seg == last_seg, jnp.exp(cum[..., -1:] - cum), 0.0)
    k_end = k * to_end[..., None]
    chunk_gamma = jnp.where(last_seg[..., 0] == 0, jnp.exp(cum[..., -1]), 0.0)  # [n, B, H]

    def step(s: jax.Array, xs: Any) -> tuple[jax.Array, tuple[jax.Array, ...]]:
        u_c, w_c, k_end_c, gam_c, qg_c, qk_c = xs
        v_new = u_c - jnp.einsum("bhck,bhkv->bhcv", w_c, s)
        outs = tuple(
            jnp.einsum("bhck,bhkv->bhcv", qg, s) + jnp.einsum("bhij,bhjv->bhiv", qk, v_new)
            for qg, qk in zip(qg_c, qk_c, strict=True)
        )
        s = gam_c[..., None, None] * s + jnp.einsum("bhck,bhcv->bhkv", k_end_c, v_new)
        return s, outs

    final, chunk_outs = jax.lax.scan(
        step,
        state_BHKV.astype(f32),
        (u, w, k_end, chunk_gamma, tuple(q_gamma), tuple(q_k)),
    )
    # [n, B, H, C, dv] -> [B, L, H, dv]
    outs = tuple(
        jnp.moveaxis(o, 0, 1).transpose(0, 1, 3, 2, 4).reshape(b, n * c, h, dv)[:, :seq]
        for o in chunk_outs
    )
    return outs, final


def delta_step(
    queries: tuple[jax.Array, ...],
    k_BHK: jax.Array,
    v_BHV: jax.Array,
    beta_BH: jax.Array,
    g_BH: jax.Array,
    active_B: jax.Array,
    state_BHKV: jax.Array,
) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """One token of the gated delta rule in float32 (decode). queries: [B, H, dk] each, read
    after the update. Inactive rows keep their state. Returns (outputs [B, H, dv], state)."""
    f32 = jnp.float32
    k, v = k_BHK.astype(f32), v_BHV.astype(f32)
    s = state_BHKV.astype(f32) * jnp.exp(g_BH.astype(f32))[..., None, None]
    delta = (v - jnp.einsum("bhk,bhkv->bhv", k, s)) * beta_BH.astype(f32)[..., None]
    s = s + k[..., :, None] * delta[..., None, :]
    outs = tuple(jnp.einsum("bhk,bhkv->bhv", q.astype(f32), s) for q in queries)
    return outs, jnp.where(active_B[:, None, None, None], s, state_BHKV.astype(f32))


def delta_step_stacked(
    queries: tuple[jax.Array, ...],
    k_BHK: jax.Array,
    v_BHV: jax.Array,
    beta_BH: jax.Array,
    g_BH: jax.Array,
    active_B: jax.Array,
    stack: jax.Array,
    li: jax.Array | int,
) -> tuple[tuple[jax.Array, ...], jax.Array]:
    """delta_step on entry li of a stacked state [layers, B, H, dk, dv] (float32), written in
    place. The old entry is read by a gather (its own buffer: a dynamic-slice read by the
    k S_{t-1} matmul aliases the stack, and XLA then copies the whole stack, every layer, as
    soon as a loop iteration updates it more than once) and the queries read the written
    entry. Returns (outputs [B, H, dv], the stack)."""
    f32 = jnp.float32
    k, v = k_BHK.astype(f32), v_BHV.astype(f32)
    a = jnp.exp(g_BH.astype(f32))[..., None, None]
    old = jnp.take(stack, li, axis=0, mode="clip").astype(f32)
    delta = (v - jnp.einsum("bhk,bhkv->bhv", k, a * old)) * beta_BH.astype(f32)[..., None]
    new = jnp.where(
        active_B[:, None, None, None], a * old + k[..., :, None] * delta[..., None, :], old
    )
    stack = jax.lax.dynamic_update_index_in_dim(stack, new.astype(stack.dtype), li, 0)
    s = jax.lax.dynamic_index_in_dim(stack, li, keepdims=False).astype(f32)
    return tuple(jnp.einsum("bhk,bhkv->bhv", q.astype(f32), s) for q in queries), stack
