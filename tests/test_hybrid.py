"""The GDN-bearing arms (gdn, hybrid, orthros_h) through the model's drivers: cached prefill +
decode + generate against the full-sequence forward, SFT output subsets, packed documents,
config validation, parameter count and the Qwen3.5 -> Orthros-H identity."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from orthros_jax import inference as inf
from orthros_jax.config import ModelConfig
from orthros_jax.inference import sampling
from orthros_jax.model import OrthrosLM, init_params, num_params

ARCHS = ("gdn", "hybrid", "orthros_h")
# GDN chunk 4, prefill chunk 6 (not a multiple of 4), window 5: chunk boundaries misaligned.
GDN = dict(
    kinds=dict(gdn=dict(num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=6, conv_kernel=3, chunk=4)),
)  # fmt: skip
LENGTHS = np.array([1, 5, 9, 17])
N_DECODE = 4
ATOL = 1e-5


def _cfg(arch: str, **kw) -> ModelConfig:
    layers = {"gdn": ("gdn",)}.get(arch, ("gdn", "attention"))
    base = dict(
        vocab_size=61, window=5, architecture=arch, prefill_chunk=6, n_layers=4,
        layer_types=layers, attention_block_q=8, attention_block_k=8, init_std=0.1,
    )  # fmt: skip
    return tiny_config(**(base | GDN | kw))


def _noisy_so(params, seed: int):
    """Every scale-offset vector (attention and GDN cross query) perturbed, so streams differ."""
    out = {}
    for key, stack in params.items():
        if not isinstance(stack, dict):
            out[key] = stack
            continue
        new = dict(stack)
        for i, name in enumerate(sorted(n for n in stack if "so_" in n)):
            noise = jax.random.normal(jax.random.PRNGKey(seed + i), stack[name].shape)
            new[name] = stack[name] + 0.3 * noise
        out[key] = new
    return out


@functools.cache
def _model(arch: str, **kw):
    cfg = _cfg(arch, **kw)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    if cfg.two_streams:
        params = _noisy_so(params, 10)
    forward = jax.jit(
        lambda p, t, **a: OrthrosLM(cfg).apply({"params": p}, t, **a),
    )
    return cfg, params, forward


def _tokens(cfg: ModelConfig, bsz: int, t: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (bsz, t))


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_then_decode_matches_forward(arch):
    cfg, params, forward = _model(arch)
    bsz, rows = len(LENGTHS), np.arange(len(LENGTHS))
    full = _tokens(cfg, bsz, LENGTHS.max() + N_DECODE)
    want = np.asarray(forward(params, jnp.asarray(full)))
    prompts = np.where(np.arange(full.shape[1])[None] < LENGTHS[:, None], full, -1)
    cache = inf.init_cache(cfg, bsz, 29)
    assert cache.states["gdn"].recurrent.shape == (
        cfg.layers_of("gdn"),
        bsz,
        4,
        8,
        6,
    )
    logits, cache = inf.prefill(params, cache, prompts, LENGTHS, cfg)
    np.testing.assert_allclose(np.asarray(logits), want[rows, LENGTHS - 1], atol=ATOL, rtol=0)
    for i in range(N_DECODE):
        logits, cache = inf.decode_step(params, cache, full[rows, LENGTHS + i], cfg)
        np.testing.assert_allclose(np.asarray(logits), want[rows, LENGTHS + i], atol=ATOL, rtol=0)


def test_continued_prefill_matches_forward():
    # The prompt arrives in two prefill calls; the second starts mid GDN chunk.
    cfg, params, forward = _model("orthros_h")
    full = _tokens(cfg, 2, 20, seed=3)
    want = np.asarray(forward(params, jnp.asarray(full)))
    cache = inf.init_cache(cfg, 2, 24)
    _, cache = inf.prefill(params, cache, full[:, :11], np.array([5, 11]), cfg)
    rest = np.zeros((2, 9), np.int64)
    rest[0, :9], rest[1, :7] = full[0, 5:14], full[1, 11:18]
    logits, cache = inf.prefill(params, cache, rest, np.array([9, 7]), cfg)
    np.testing.assert_allclose(np.asarray(logits), want[[0, 1], [13, 17]], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ("gdn", "orthros_h"))
def test_greedy_generate_matches_forward_argmax(arch):
    cfg, params, forward = _model(arch)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [11, 12]]
    n = 5
    out = inf.generate(params, prompts, cfg, max_new_tokens=n, sampler=sampling.greedy())
    seqs = np.zeros((2, 7 + n), np.int64)
    lens = np.array([7, 2])
    for i, p in enumerate(prompts):
        seqs[i, : len(p)] = p
    for i in range(n):
        logits = np.asarray(forward(params, jnp.asarray(seqs)))
        nxt = logits[[0, 1], lens + i - 1].argmax(-1)
        seqs[[0, 1], lens + i] = nxt
    want = np.stack([seqs[r, lens[r] : lens[r] + n] for r in range(2)])
    np.testing.assert_array_equal(out.tokens, want)


def test_sft_output_subset_equals_pt_logits():
    # Unsorted output positions: the cross outputs are gathered from base alignment.
    cfg, params, forward = _model("orthros_h")
    toks = _tokens(cfg, 2, 14, seed=5)
    pt = np.asarray(forward(params, jnp.asarray(toks)))
    idx = np.array([[9, 2, 13, 5], [0, 11, 7, 8]])
    sft = np.asarray(forward(params, jnp.asarray(toks), output_positions=jnp.asarray(idx)))
    np.testing.assert_allclose(sft, pt[np.arange(2)[:, None], idx], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ("gdn", "orthros_h"))
def test_packed_documents_equal_separate_rows(arch):
    cfg, params, forward = _model(arch)
    a, b = _tokens(cfg, 1, 7, seed=6)[0], _tokens(cfg, 1, 6, seed=7)[0]
    packed = np.concatenate([a, b, [0]])[None]
    pos = np.concatenate([np.arange(7), np.arange(6), [0]])[None]
    seg = np.concatenate([np.ones(7), 2 * np.ones(6), [0]])[None].astype(np.int32)
    got = np.asarray(
        forward(params, jnp.asarray(packed), positions=jnp.asarray(pos), segment_ids=seg)
    )
    # window 5 < 7: the attention layers' windows also stay inside each document.
    want_a = np.asarray(forward(params, jnp.asarray(a[None])))[0]
    want_b = np.asarray(forward(params, jnp.asarray(b[None])))[0]
    np.testing.assert_allclose(got[0, :7], want_a, atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[0, 7:13], want_b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_num_params_counts_the_tree(arch):
    cfg = _cfg(arch, attn_output_gate=True, qk_norm=True)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    assert num_params(cfg) == sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))


def test_arms_and_layer_types_validated():
    assert ModelConfig(architecture="gdn").layer_types == ("gdn",)
    hyb = ModelConfig(architecture="hybrid", n_layers=8)
    assert hyb.layer_types == ("gdn", "gdn", "gdn", "attention")
    assert hyb.base_window is None and not hyb.two_streams and not hyb.scale_offset
    oh = ModelConfig(architecture="orthros_h", n_layers=4)
    assert oh.base_window == oh.window and oh.two_streams and oh.scale_offset
    with pytest.raises(ValueError, match="does not fit architecture 'gdn'"):
        ModelConfig(architecture="gdn", layer_types=("gdn", "attention"))
    with pytest.raises(ValueError, match=r"needs \['attention'\] layers and recurrent ones"):
        ModelConfig(architecture="hybrid", layer_types=("attention",))
    with pytest.raises(ValueError, match="only 'attention' layers"):
        ModelConfig(architecture="orthros", layer_types=("gdn",))
    with pytest.raises(ValueError, match=r"kinds\.gdn\.chunk must be a positive int"):
        ModelConfig(architecture="gdn", kinds=dict(gdn=dict(chunk=0)))
    with pytest.raises(ValueError, match=r"kinds\.gdn\.num_v_heads=3 must be a multiple"):
        ModelConfig(architecture="gdn", kinds=dict(gdn=dict(num_k_heads=2, num_v_heads=3)))
    with pytest.raises(ValueError, match="scale_offset=True needs a two-stream"):
        ModelConfig(architecture="hybrid", n_layers=4, scale_offset=True)


@pytest.mark.optimized  # about the compiled program
def test_decode_temporaries_do_not_grow_with_the_cycle():
    # XLA:CPU copies each dynamically indexed weight slice before its dot; were every layer's
    # copy of a mixed cycle hoisted to the top of the loop body (as its scheduler does unless a
    # layer's index depends on the layer before), the temporaries would grow with the cycle:
    # 6.8 MB for (gdn, attention) and 13.3 MB for (gdn, gdn, gdn, attention) at this width.
    from orthros_jax.inference import drivers

    def temp_bytes(cycle: tuple[str, ...]) -> int:
        cfg = tiny_config(architecture="hybrid", layer_types=cycle, n_layers=2 * len(cycle),
                          d_model=256, head_dim=32, d_ff=1024, **GDN)  # fmt: skip
        params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
        cache = jax.eval_shape(lambda: inf.init_cache(cfg, 1, 16))
        tok, act = jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((1,), bool)
        compiled = drivers.decode_jit.lower(params, cache, tok, act, cfg=cfg).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    short, long = temp_bytes(("gdn", "attention")), temp_bytes(("gdn", "gdn", "gdn", "attention"))
    assert long <= 1.1 * short, (short, long)
