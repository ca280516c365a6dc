"""The attention kernels against the dense masked reference, and their memory shape."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orthros_jax.kernels.attention import global_attention, local_attention
from orthros_jax.kernels.reference import reference_attention


def _qkv(seed: int, b: int, lq: int, lk: int, n: int, k: int, h: int):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(keys[0], (b, lq, n, h), jnp.float32)
    kk = jax.random.normal(keys[1], (b, lk, k, h), jnp.float32)
    v = jax.random.normal(keys[2], (b, lk, k, h), jnp.float32)
    return q, kk, v


def _packed(b: int, t: int, boundaries: list[int]):
    """Segment ids (1, 2, ...) and positions reset at each boundary; same for every row."""
    seg = np.ones((t,), np.int32)
    pos = np.arange(t, dtype=np.int32)
    for i, start in enumerate(boundaries):
        seg[start:] = i + 2
        pos[start:] = np.arange(t - start)
    return jnp.asarray(np.tile(pos, (b, 1))), jnp.asarray(np.tile(seg, (b, 1)))


LOCAL_CASES = [
    # (T, window, N, K, block_size, packed boundaries)
    (37, 8, 4, 2, None, []),  # T not a multiple of w, GQA
    (16, 16, 2, 2, None, []),  # w == T
    (10, 64, 4, 1, None, []),  # w > T (MQA)
    (50, 7, 6, 3, 4, [13, 31]),  # block < w (three key blocks per query block), packed
    (64, 16, 4, 4, None, [5, 40]),  # packed, MHA
]


@pytest.mark.slow
@pytest.mark.parametrize("t,window,n,k,block,bounds", LOCAL_CASES)
def test_local_attention_matches_dense_reference(t, window, n, k, block, bounds):
    q, kk, v = _qkv(t + window, 2, t, t, n, k, 8)
    pos, seg = _packed(2, t, bounds)
    got = local_attention(
        q,
        kk,
        v,
        q_positions=pos,
        k_positions=pos,
        window=window,
        q_segment_ids=seg,
        k_segment_ids=seg,
        block_size=block,
    )
    want = reference_attention(
        q,
        kk,
        v,
        q_positions=pos,
        k_positions=pos,
        q_segment_ids=seg,
        k_segment_ids=seg,
        window=window,
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_local_attention_with_cache_prefix_matches_full_sequence():
    # A chunk that reads its previous window from a prefix equals the unchunked computation.
    t, window, start = 40, 6, 17
    q, kk, v = _qkv(3, 2, t, t, 4, 2, 8)
    pos = jnp.broadcast_to(jnp.arange(t), (2, t))
    full = local_attention(q, kk, v, q_positions=pos, k_positions=pos, window=window)
    seg = jnp.ones((2, start), jnp.int32)
    chunk = local_attention(
        q[:, start:],
        kk[:, start:],
        v[:, start:],
        q_positions=pos[:, start:],
        k_positions=pos[:, start:],
        window=window,
        prefix=(kk[:, :start], v[:, :start], pos[:, :start], seg),
    )
    np.testing.assert_allclose(np.asarray(chunk), np.asarray(full[:, start:]), atol=1e-5, rtol=0)


GLOBAL_CASES = [
    # (Lq, Lk, N, K, block_q, block_k, packed boundaries)
    (37, 37, 4, 2, 8, 16, []),
    (50, 50, 6, 3, 16, 8, [13, 31]),
    (1, 29, 4, 1, 512, 512, []),
    (9, 9, 2, 2, 512, 512, [4]),
]


@pytest.mark.slow
@pytest.mark.parametrize("lq,lk,n,k,bq,bk,bounds", GLOBAL_CASES)
def test_global_attention_matches_dense_reference(lq, lk, n, k, bq, bk, bounds):
    q, kk, v = _qkv(lq * 7 + lk, 2, lk, lk, n, k, 8)
    pos, seg = _packed(2, lk, bounds)
    # Arbitrary query positions: a random subset of the key tokens, in shuffled order.
    rng = np.random.default_rng(lq + lk)
    idx = jnp.asarray(np.stack([rng.permutation(lk)[:lq] for _ in range(2)]))
    take = jax.vmap(lambda a, i: a[i])
    qq, qpos, qseg = take(q, idx), take(pos, idx), take(seg, idx)
    got = global_attention(
        qq,
        kk,
        v,
        q_positions=qpos,
        k_positions=pos,
        q_segment_ids=qseg,
        k_segment_ids=seg,
        block_q=bq,
        block_k=bk,
    )
    want = reference_attention(
        qq, kk, v, q_positions=qpos, k_positions=pos, q_segment_ids=qseg, k_segment_ids=seg
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)
    # The same keys in a head-major [B, K, Lk, H] cache layout.
    head_major = global_attention(
        qq,
        jnp.swapaxes(kk, 1, 2),
        jnp.swapaxes(v, 1, 2),
        q_positions=qpos,
        k_positions=pos,
        q_segment_ids=qseg,
        k_segment_ids=seg,
        block_q=bq,
        block_k=bk,
        kv_head_major=True,
    )
    np.testing.assert_allclose(np.asarray(head_major), np.asarray(want), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_global_attention_bfloat16_inputs_use_float32_softmax():
    q, kk, v = _qkv(0, 1, 24, 24, 2, 1, 16)
    pos = jnp.broadcast_to(jnp.arange(24), (1, 24))
    got = global_attention(
        q.astype(jnp.bfloat16),
        kk.astype(jnp.bfloat16),
        v.astype(jnp.bfloat16),
        q_positions=pos,
        k_positions=pos,
        block_q=8,
        block_k=8,
    )
    want = reference_attention(q, kk, v, q_positions=pos, k_positions=pos)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), atol=5e-2, rtol=0)


def _all_shapes(jaxpr) -> list[tuple[int, ...]]:
    """Shapes of every intermediate value in a jaxpr, recursing into sub-jaxprs."""
    shapes = []
    for eqn in jaxpr.eqns:
        shapes += [tuple(getattr(o.aval, "shape", ())) for o in eqn.outvars]
        for param in eqn.params.values():
            subs = param if isinstance(param, (list, tuple)) else [param]
            for sub in subs:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    shapes += _all_shapes(inner)
    return shapes


def _assert_no_quadratic(fn, *args, t: int):
    shapes = _all_shapes(jax.make_jaxpr(fn)(*args).jaxpr)
    assert shapes, "no intermediates found: the check would be vacuous"
    quadratic = [s for s in shapes if sum(d >= t for d in s) >= 2]
    assert not quadratic, f"arrays with two dimensions >= T={t}: {quadratic[:5]}"
    hlo = jax.jit(fn).lower(*args).as_text()
    assert f"{t},{t}" not in hlo.replace(" ", "")


def test_local_attention_never_builds_t_by_t():
    t, window = 8192, 128
    q = jax.ShapeDtypeStruct((1, t, 4, 32), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, t, 2, 32), jnp.float32)
    pos = jax.ShapeDtypeStruct((1, t), jnp.int32)

    def fn(q, k, v, pos):
        return local_attention(q, k, v, q_positions=pos, k_positions=pos, window=window)

    _assert_no_quadratic(fn, q, kv, kv, pos, t=t)


def test_orthros_prefill_shaped_forward_never_builds_t_by_t():
    from helpers import tiny_config

    from orthros_jax.model import OrthrosLM, init_params

    t = 8192
    cfg = tiny_config(d_model=64, head_dim=16, d_ff=128, window=128)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    tokens = jax.ShapeDtypeStruct((1, t), jnp.int32)
    last = jnp.full((1, 1), t - 1, jnp.int32)

    def fn(params, tokens):
        return OrthrosLM(cfg).apply({"params": params}, tokens, output_positions=last)

    _assert_no_quadratic(fn, params, tokens, t=t)


def test_global_attention_gradient_matches_dense_reference():
    # The backward pass rematerialises each query block: its gradients are the dense ones.
    q, k, v = _qkv(3, 2, 40, 40, 4, 2, 8)
    pos, seg = _packed(2, 40, [17])
    ct = jax.random.normal(jax.random.PRNGKey(9), q.shape, q.dtype)

    def loss(fn, **kw):
        def f(q, k, v):
            out = fn(q, k, v, q_positions=pos, k_positions=pos, **kw)
            return (out * ct).sum()

        return jax.grad(f, argnums=(0, 1, 2))(q, k, v)

    segs = dict(q_segment_ids=seg, k_segment_ids=seg)
    got = loss(global_attention, block_q=16, block_k=8, **segs)
    want = loss(reference_attention, **segs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=0)


def _grad_temp_bytes(t: int) -> int:
    q = jax.ShapeDtypeStruct((1, t, 4, 32), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, t, 2, 32), jnp.float32)
    pos = jnp.arange(t)[None]

    def loss(q, k, v):
        return global_attention(q, k, v, q_positions=pos, k_positions=pos).sum()

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.optimized  # about the compiled program
def test_global_attention_gradient_memory_is_linear_in_length():
    # Without the per-block remat the backward keeps every block's scores: 2048 -> 4096
    # grew temp memory 3.4x (237 -> 801 MiB); with it 1.7x (71 -> 121 MiB).
    small, large = _grad_temp_bytes(2048), _grad_temp_bytes(4096)
    assert large / small < 2.2, (small, large)
    assert large < 4 * 4096 * 4096 * 4, "more than one float32 [N, T, T] score tensor live"


@pytest.mark.parametrize("quantized", [False, True])
def test_few_queries_read_block_by_block_from_a_cache_stack(quantized):
    """few_query_stacked (decode's read on CPU) equals the dense reference over the layer:
    several blocks, a last block clamped into the stack (S = 37), rows of different lengths (one
    whose keys end inside the first block: the later blocks are skipped), a query that sees no
    key, GQA, a traced layer index, an int8 stack."""
    from orthros_jax.kernels import slots
    from orthros_jax.kernels.attention import visibility
    from orthros_jax.kernels.few_queries import few_query_stacked

    layers, b, s, n, k, h, nq = 3, 3, 37, 4, 2, 8, 3
    rng = np.random.default_rng(0)
    ks = jnp.asarray(rng.normal(size=(layers, b, k, s, h)), jnp.float32)
    vs = jnp.asarray(rng.normal(size=(layers, b, k, s, h)), jnp.float32)
    q = jnp.asarray(rng.normal(size=(b, nq, n, h)), jnp.float32)
    lengths = jnp.array([37, 6, 20])
    k_pos = jnp.broadcast_to(jnp.arange(s), (b, s))
    k_seg = jnp.where(k_pos < lengths[:, None], 1, -1)
    q_pos = lengths[:, None] - nq + jnp.arange(nq)
    q_seg = jnp.ones((b, nq), jnp.int32).at[2, 0].set(7)  # row 2's first query sees nothing
    visible = visibility(q_pos, q_seg, k_pos, k_seg, None)
    if quantized:
        ks, vs = (slots.QuantKV(*slots.quantize(x, "int8", jnp.float32)) for x in (ks, vs))
    read = jax.jit(few_query_stacked, static_argnames="block")
    for layer in (0, 2):
        kl, vl = slots.layer_view(ks, layer), slots.layer_view(vs, layer)
        want = reference_attention(
            q,
            jnp.swapaxes(kl, 1, 2),
            jnp.swapaxes(vl, 1, 2),
            q_positions=q_pos,
            k_positions=k_pos,
            q_segment_ids=q_seg,
            k_segment_ids=k_seg,
        )
        want = want.at[2, 0].set(0.0)  # no visible key: 0 (the reference averages padding)
        for block in (5, 16, 64):
            got = read(q, ks, vs, jnp.int32(layer), visible, block=block)
            np.testing.assert_allclose(got, want, atol=2e-6, rtol=2e-6, err_msg=f"{block}")
