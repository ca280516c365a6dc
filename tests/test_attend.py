"""The attention seam: every implementation against the dense reference, in every key layout a
mode produces; the position contract; the model's modes under `dot_product`."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import our_logits

from orthros_jax import inference as inf
from orthros_jax.config import ModelConfig
from orthros_jax.kernels.attention import local_attention
from orthros_jax.kernels.reference import reference_attention
from orthros_jax.layers.attend import Keys
from orthros_jax.layers.attention_impls import attend
from orthros_jax.model import OrthrosLM, init_params

CFG = ModelConfig(attention_block_q=8, attention_block_k=8, attention_block_local=4)


def _qkv(seed: int, b: int, t: int, n: int = 4, k: int = 2, h: int = 8):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (
        jax.random.normal(keys[0], (b, t, n, h)),
        jax.random.normal(keys[1], (b, t, k, h)),
        jax.random.normal(keys[2], (b, t, k, h)),
    )


def _packed(b: int, t: int, start: int):
    pos = np.tile(np.arange(t), (b, 1))
    seg = np.ones((b, t), np.int32)
    pos[:, start:] -= start
    seg[:, start:] = 2
    return jnp.asarray(pos, jnp.int32), jnp.asarray(seg)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["xla", "dot_product"])
@pytest.mark.parametrize("window", [5, None])
@pytest.mark.parametrize("packed", [False, True])
def test_aligned_sequence_matches_reference(impl, window, packed):
    t = 21
    q, k, v = _qkv(1, 2, t)
    if packed:
        pos, seg = _packed(2, t, 9)
    else:
        pos, seg = jnp.broadcast_to(jnp.arange(t), (2, t)), jnp.ones((2, t), jnp.int32)
    keys = Keys(k, v, pos, seg, aligned=True, default_positions=not packed)
    got = attend(impl, q, pos, seg, keys, window, CFG)
    want = reference_attention(
        q,
        k,
        v,
        q_positions=pos,
        k_positions=pos,
        q_segment_ids=seg,
        k_segment_ids=seg,
        window=window,
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["xla", "dot_product"])
def test_chunk_with_cache_prefix_matches_reference(impl):
    # A prefill chunk's window: its own keys plus the W-1 slots before it, some before slot 0.
    t, w, start = 16, 6, 3
    q, k, v = _qkv(2, 2, t)
    pos = jnp.broadcast_to(jnp.arange(t), (2, t))
    pre = jnp.broadcast_to(jnp.arange(start - (w - 1), start), (2, w - 1))
    pre_seg = jnp.where(pre >= 0, 1, -1)
    take = jnp.clip(pre, 0)
    prefix = (k[:, take[0]], v[:, take[0]], pre, pre_seg)
    ones = jnp.ones((2, t - start), jnp.int32)
    keys = Keys(k[:, start:], v[:, start:], pos[:, start:], ones, prefix=prefix, aligned=True)
    got = attend(impl, q[:, start:], pos[:, start:], ones, keys, w, CFG)
    want = reference_attention(q, k, v, q_positions=pos, k_positions=pos, window=w)[:, start:]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["xla", "dot_product"])
@pytest.mark.parametrize("window", [4, None])
def test_few_queries_over_head_major_cache(impl, window):
    # Decode: one query per row at its own position over a head-major cache with unused slots.
    s = 19
    q, k, v = _qkv(3, 2, s)
    qpos = jnp.asarray([[7], [18]], jnp.int32)
    slots = jnp.broadcast_to(jnp.arange(s), (2, s))
    slot_seg = jnp.where(slots <= qpos, 1, -1)
    keys = Keys(jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), slots, slot_seg, head_major=True)
    ones = jnp.ones((2, 1), jnp.int32)
    rows = jnp.arange(2)
    got = attend(impl, q[rows, qpos[:, 0]][:, None], qpos, ones, keys, window, CFG)
    want = reference_attention(q, k, v, q_positions=slots, k_positions=slots, window=window)[
        rows, qpos[:, 0]
    ][:, None]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_floor_is_identity_and_unknown_names_are_refused():
    from benchmarks.common import floor

    q, k, v = _qkv(4, 1, 8)
    pos = jnp.broadcast_to(jnp.arange(8), (1, 8))
    keys = Keys(k, v, pos, jnp.ones_like(pos), aligned=True)
    np.testing.assert_array_equal(np.asarray(attend(floor, q, pos, pos, keys, 3, CFG)), q)
    with pytest.raises(ValueError, match="floor"):  # not a model's implementation
        attend("floor", q, pos, pos, keys, 3, CFG)


@pytest.mark.slow
def test_local_attention_rejects_positions_that_break_the_contract():
    # Repeated positions (arange(T) // 4) once differed from the reference by 1.1 silently.
    t = 16
    q, k, v = _qkv(5, 1, t)
    pos = jnp.asarray(np.arange(t)[None] // 4, jnp.int32)
    with pytest.raises(ValueError, match="positions must increase"):
        local_attention(q, k, v, q_positions=np.asarray(pos), k_positions=pos, window=4)
    # A position reset at a document boundary is fine (new segment).
    pos2, seg2 = _packed(1, t, 6)
    local_attention(
        q,
        k,
        v,
        q_positions=np.asarray(pos2),
        k_positions=pos2,
        window=4,
        q_segment_ids=np.asarray(seg2),
        k_segment_ids=seg2,
    )
    # Traced positions are not checked (documented contract).
    jax.jit(lambda p: local_attention(q, k, v, q_positions=p, k_positions=p, window=4))(pos)


MODEL = ModelConfig(
    vocab_size=53,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=64,
    window=5,
    prefill_chunk=8,
    attention_block_q=8,
    attention_block_k=8,
    init_std=0.1,
)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["orthros", "transformer", "swa"])
def test_model_modes_under_dot_product(arch):
    cfg = MODEL.replace(architecture=arch, scale_offset=None)
    dp = cfg.replace(attention_impl="dot_product")
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 19), 0, cfg.vocab_size)
    pos, seg = _packed(2, 19, 7)
    idx = jnp.asarray([[12, 3, 18], [0, 9, 6]])
    kw = dict(positions=pos, segment_ids=seg, output_positions=idx)

    # One jitted program per implementation for the three modes (an eager apply re-traces and
    # dispatches op by op).
    @functools.partial(jax.jit, static_argnums=0)
    def modes(c, p, t):
        m = OrthrosLM(c)
        return (
            m.apply({"params": p}, t),
            m.apply({"params": p}, t, **kw),
            m.apply({"params": p}, t, output_positions=idx),
        )

    want, want_packed, _ = (np.asarray(a) for a in modes(cfg, params, tokens))
    got, got_packed, got_sft = (np.asarray(a) for a in modes(dp, params, tokens))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # Packed documents (explicit mask path) and SFT at unsorted output positions.
    np.testing.assert_allclose(got_packed, want_packed, atol=1e-5, rtol=0)
    # SFT with default positions: the copies are not the keys' own queries, so the built-in
    # (top-left aligned) causal mask must not be used for them (it was, off by up to 1.25).
    np.testing.assert_allclose(
        got_sft, want[np.arange(2)[:, None], np.asarray(idx)], atol=1e-5, rtol=0
    )
    # Chunked prefill (3 chunks, ragged) then two decode steps equal the PT forward.
    lengths = np.array([17, 6])
    cache = inf.init_cache(dp, 2, 24)
    logits, cache = inf.prefill(params, cache, np.asarray(tokens), lengths, dp)
    np.testing.assert_allclose(np.asarray(logits), want[[0, 1], lengths - 1], atol=1e-5, rtol=0)
    nxt = np.asarray(tokens)[[0, 1], lengths]
    logits, cache = inf.decode_step(params, cache, nxt, dp)
    np.testing.assert_allclose(np.asarray(logits), want[[0, 1], lengths], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_layer_types_cycle_equals_uniform_stack():
    # A two-slot cycle of attention layers is the same model as the uniform stack: the scan runs
    # over cycles (the Transformer arm has no separate last layer) and reads slots by rank.
    cfg = MODEL.replace(n_layers=4, architecture="transformer", scale_offset=None)
    cyc = cfg.replace(layer_types=("attention", "attention"), remat="full")
    params = init_params(cfg, jax.random.PRNGKey(2))
    tokens = jax.random.randint(jax.random.PRNGKey(3), (1, 9), 0, cfg.vocab_size)
    np.testing.assert_allclose(
        our_logits(cyc, params, tokens),
        our_logits(cfg, params, tokens),
        atol=1e-6,
        rtol=0,
    )
