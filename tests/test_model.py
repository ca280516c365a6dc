"""OrthrosLM: arm equivalences, base-stream independence, causality, SFT mode, gradients."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import randomize_so, single_stream, tiny_config

from orthros_jax.layers.attention import layer_kv, step
from orthros_jax.layers.kind import SEQUENCE, StepContext
from orthros_jax.model import OrthrosLM, Stream, init_params

BASE = tiny_config(
    vocab_size=97,
    d_model=48,
    n_layers=2,
    head_dim=12,
    d_ff=96,
    window=6,
    attention_block_q=8,
    attention_block_k=8,
)
T = 29


def _tokens(seed: int = 0, b: int = 2, t: int = T, vocab: int = 97) -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(seed), (b, t), 0, vocab)


@functools.cache
def _jitted(cfg):
    return jax.jit(lambda p, t, **kw: OrthrosLM(cfg).apply({"params": p}, t, **kw))


def _apply(cfg, params, tokens, **kw):
    # Jitted, once per config: an eager apply re-traces and re-dispatches every op on every
    # call, and tests here call one config at one shape several times.
    return np.asarray(_jitted(cfg)(params, jnp.asarray(tokens), **kw))


@pytest.fixture(scope="module")
def params():
    return init_params(BASE, jax.random.PRNGKey(0))


@pytest.mark.slow
def test_identity_so_and_full_window_equals_transformer(params):
    tokens = _tokens()
    wide = BASE.replace(window=T)
    transformer = BASE.replace(architecture="transformer", scale_offset=False)
    swa = BASE.replace(architecture="swa", scale_offset=False, window=T + 5)
    want = _apply(transformer, single_stream(params), tokens)
    np.testing.assert_allclose(_apply(wide, params, tokens), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(_apply(swa, single_stream(params), tokens), want, atol=1e-5, rtol=0)
    # A real window changes the base stream, hence the output stream's K/V: logits differ.
    narrow = _apply(BASE, params, tokens)
    assert np.abs(narrow - want).max() > 1e-3
    # And the output stream still differs from the SWA arm (it reads the whole history).
    swa_narrow = _apply(
        BASE.replace(architecture="swa", scale_offset=False), single_stream(params), tokens
    )
    assert np.abs(narrow - swa_narrow).max() > 1e-3


def _layer_kvs(cfg, params, tokens, with_out: bool):
    """Every layer's base K/V, running the real layer step in sequence mode layer by layer."""
    model = OrthrosLM(cfg)
    x = model.apply({"params": params}, tokens, method=OrthrosLM.embed)
    b, t = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    base = Stream(x, pos, jnp.ones((b, t), jnp.int32))
    out = base if with_out else None
    ctx = StepContext(mode=SEQUENCE, impl="xla")
    kvs = []
    for i in range(cfg.n_layers):
        p = jax.tree.map(lambda a, i=i: a[i], params["layers"])
        kvs.append(layer_kv(p, base.x, base.positions, cfg))
        base, out, _ = step(p, cfg, base, out, None, i, ctx)
    return kvs


@pytest.mark.slow
def test_base_kv_independent_of_output_stream(params):
    tokens = _tokens(1)
    ref = _layer_kvs(BASE, params, tokens, with_out=True)
    changed_out_so = dict(params["layers"])
    for name in ("so_out_scale", "so_out_offset"):
        changed_out_so[name] = changed_out_so[name] + 0.5
    variants = [
        _layer_kvs(BASE, {**params, "layers": changed_out_so}, tokens, with_out=True),
        _layer_kvs(BASE, params, tokens, with_out=False),
    ]
    for kvs in variants:
        for (k0, v0), (k1, v1) in zip(ref, kvs, strict=True):
            np.testing.assert_array_equal(np.asarray(k0), np.asarray(k1))
            np.testing.assert_array_equal(np.asarray(v0), np.asarray(v1))
    # Control: the base SO does change the K/V of later layers.
    changed_base_so = dict(params["layers"])
    changed_base_so["so_base_scale"] = changed_base_so["so_base_scale"] * 1.5
    other = _layer_kvs(BASE, {**params, "layers": changed_base_so}, tokens, with_out=True)
    assert np.abs(np.asarray(other[1][0]) - np.asarray(ref[1][0])).max() > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["orthros", "transformer", "swa"])
def test_causal_and_packed_segments_isolated(params, arch):
    cfg = BASE if arch == "orthros" else BASE.replace(architecture=arch, scale_offset=False)
    p = randomize_so(params, 3, 0.3) if arch == "orthros" else single_stream(params)
    tokens = _tokens(2)
    t_cut = 17
    changed = tokens.at[:, t_cut + 1 :].set((tokens[:, t_cut + 1 :] + 5) % 97)
    a, b = _apply(cfg, p, tokens), _apply(cfg, p, changed)
    np.testing.assert_allclose(a[:, : t_cut + 1], b[:, : t_cut + 1], atol=1e-6, rtol=0)
    assert np.abs(a[:, t_cut + 1 :] - b[:, t_cut + 1 :]).max() > 1e-4

    # Two documents packed in one row behave exactly as if each ran alone.
    split = 11
    seg = jnp.where(jnp.arange(T) < split, 1, 2)[None].repeat(2, 0)
    pos = jnp.where(jnp.arange(T) < split, jnp.arange(T), jnp.arange(T) - split)[None].repeat(2, 0)
    packed = _apply(cfg, p, tokens, positions=pos, segment_ids=seg)
    first = _apply(cfg, p, tokens[:, :split])
    second = _apply(cfg, p, tokens[:, split:])
    np.testing.assert_allclose(packed[:, :split], first, atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed[:, split:], second, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["orthros", "transformer"])
def test_sft_logits_equal_pt_logits_at_output_positions(params, arch):
    cfg = BASE if arch == "orthros" else BASE.replace(architecture=arch, scale_offset=False)
    p = randomize_so(params, 4, 0.3) if arch == "orthros" else single_stream(params)
    tokens = _tokens(5)
    pt = _apply(cfg, p, tokens)
    idx = jnp.asarray([[3, 20, 28, 7], [0, 1, 13, 13]], jnp.int32)
    sft = _apply(cfg, p, tokens, output_positions=idx)
    assert sft.shape == (2, 4, 97)
    np.testing.assert_allclose(
        sft, np.take_along_axis(pt, np.asarray(idx)[..., None], 1), atol=1e-5, rtol=0
    )


@pytest.mark.slow
def test_gradients_reach_shared_weights_and_both_so_sets(params):
    tokens = _tokens(6)
    model = OrthrosLM(BASE)

    def loss(p):
        logits = model.apply({"params": p}, tokens)
        return -jnp.mean(jax.nn.log_softmax(logits)[:, :-1].max(-1))

    grads = jax.jit(jax.grad(loss))(randomize_so(params, 7, 0.3))
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    for path, g in flat:
        g = np.asarray(g)
        assert np.isfinite(g).all(), path
        name = jax.tree_util.keystr(path)
        if "so_base" in name:
            # The last layer's base stream is dead (skipped): its SO gets exactly no gradient.
            assert np.abs(g[:-1]).max() > 0, name
            np.testing.assert_array_equal(g[-1], 0.0)
        else:
            assert np.abs(g).max() > 0, name


@pytest.mark.slow
def test_no_so_params_without_scale_offset():
    p = init_params(BASE.replace(scale_offset=False), jax.random.PRNGKey(0))
    assert not [k for k in p["layers"] if k.startswith("so_")]
    p_so = init_params(BASE, jax.random.PRNGKey(0))
    assert {k for k in p_so["layers"] if k.startswith("so_")} == {
        "so_base_scale",
        "so_base_offset",
        "so_out_scale",
        "so_out_offset",
    }
    np.testing.assert_array_equal(np.asarray(p_so["layers"]["so_out_scale"]), 1.0)
    np.testing.assert_array_equal(np.asarray(p_so["layers"]["so_out_offset"]), 0.0)


@pytest.mark.slow
def test_scan_and_unrolled_layers_agree(params):
    tokens = _tokens(8)
    a = _apply(BASE, params, tokens)
    b = _apply(BASE.replace(scan_layers=False), params, tokens)
    c = _apply(BASE.replace(remat="full"), params, tokens)
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    np.testing.assert_allclose(a, c, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_repeated_positions_are_refused_before_the_scan():
    """positions that repeat inside a segment would make the blocked window kernel read the
    wrong keys (it finds a query's window among the array's previous keys): refused while
    they are concrete, for every attention implementation."""
    from orthros_jax.config import ModelConfig
    from orthros_jax.model import OrthrosLM, init_params

    cfg = ModelConfig(
        vocab_size=32,
        d_model=16,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        d_ff=32,
        window=4,
    )
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.zeros((1, 16), jnp.int32)
    positions = jnp.arange(16)[None] // 4
    for impl in ("xla", "dot_product"):
        with pytest.raises(ValueError, match="positions must increase"):
            OrthrosLM(cfg.replace(attention_impl=impl)).apply(
                {"params": params}, tokens, positions=positions
            )
