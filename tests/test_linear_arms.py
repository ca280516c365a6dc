"""The GLA / retention kinds through the model's drivers: the pure arms gla and retnet and
both kinds in hybrid / orthros_h cycles; cached prefill (uneven chunks, continued) + decode +
generate against the full-sequence forward, SFT output subsets, packed documents, parameter
count, config validation, and the compiled decode step updating the stacked state in place."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from orthros_jax import inference as inf
from orthros_jax.config import ModelConfig
from orthros_jax.inference import drivers, sampling
from orthros_jax.model import OrthrosLM, init_params, num_params

# Kernel chunks 4, prefill chunk 6, window 5: chunk boundaries misaligned everywhere.
LINEAR = dict(
    kinds=dict(gla=dict(heads=4, kv_heads=2, k_head_dim=8, v_head_dim=6, short_conv=True, conv_kernel=3, chunk=4), retention=dict(heads=4, kv_heads=2, k_head_dim=8, v_head_dim=6, chunk=4)),
)  # fmt: skip
ARMS = {
    "gla": ("gla", ("gla",)),
    "retnet": ("retnet", ("retention",)),
    "hybrid_gla": ("hybrid", ("gla", "attention")),
    "orthros_h_ret": ("orthros_h", ("retention", "attention")),
    "orthros_h_gla": ("orthros_h", ("gla", "attention")),
    # the GDN arms, for the decode HLO check only
    "gdn": ("gdn", ("gdn",)),
    "hybrid_gdn": ("hybrid", ("gdn", "gdn", "gdn", "attention")),
}
LENGTHS = np.array([1, 5, 9, 17])
N_DECODE = 4
ATOL = 1e-5


def _cfg(name: str, **kw) -> ModelConfig:
    arch, layers = ARMS[name]
    base = dict(
        vocab_size=61, window=5, architecture=arch, prefill_chunk=6, n_layers=4,
        layer_types=layers, attention_block_q=8, attention_block_k=8, init_std=0.1,
    )  # fmt: skip
    return tiny_config(**(base | LINEAR | kw))


@functools.cache
def _model(name: str):
    cfg = _cfg(name)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    noisy = {}  # SO and norm gains off their init, so the streams and norms matter
    for key, stack in params.items():
        if isinstance(stack, dict):
            stack = {n: a + 0.3 * jax.random.normal(jax.random.PRNGKey(len(n)), a.shape)
                     if ("so_" in n or n.endswith("norm")) else a for n, a in stack.items()}  # fmt: skip
        noisy[key] = stack
    forward = jax.jit(lambda p, t, **a: OrthrosLM(cfg).apply({"params": p}, t, **a))
    return cfg, noisy, forward


def _tokens(cfg: ModelConfig, bsz: int, t: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (bsz, t))


# hybrid_gla's and orthros_h_ret's prefill + decode are checked by generate / the HLO test.
@pytest.mark.parametrize("name", ["gla", "retnet", "orthros_h_gla"])
def test_prefill_then_decode_matches_forward(name):
    cfg, params, forward = _model(name)
    bsz, rows = len(LENGTHS), np.arange(len(LENGTHS))
    full = _tokens(cfg, bsz, LENGTHS.max() + N_DECODE)
    want = np.asarray(forward(params, jnp.asarray(full)))
    prompts = np.where(np.arange(full.shape[1])[None] < LENGTHS[:, None], full, -1)
    cache = inf.init_cache(cfg, bsz, 29)
    logits, cache = inf.prefill(params, cache, prompts, LENGTHS, cfg)
    np.testing.assert_allclose(np.asarray(logits), want[rows, LENGTHS - 1], atol=ATOL, rtol=0)
    for i in range(N_DECODE):
        logits, cache = inf.decode_step(params, cache, full[rows, LENGTHS + i], cfg)
        np.testing.assert_allclose(np.asarray(logits), want[rows, LENGTHS + i], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["retnet", "orthros_h_gla"])
def test_continued_prefill_matches_forward(name):
    """The prompt arrives in two prefill calls; the second starts mid kernel chunk (and, for
    RetNet, at rotary positions 5 / 11)."""
    cfg, params, forward = _model(name)
    full = _tokens(cfg, 2, 20, seed=3)
    want = np.asarray(forward(params, jnp.asarray(full)))
    cache = inf.init_cache(cfg, 2, 24)
    _, cache = inf.prefill(params, cache, full[:, :11], np.array([5, 11]), cfg)
    rest = np.zeros((2, 9), np.int64)
    rest[0, :9], rest[1, :7] = full[0, 5:14], full[1, 11:18]
    logits, cache = inf.prefill(params, cache, rest, np.array([9, 7]), cfg)
    np.testing.assert_allclose(np.asarray(logits), want[[0, 1], [13, 17]], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["gla", "orthros_h_ret"])
def test_greedy_generate_matches_forward_argmax(name):
    cfg, params, forward = _model(name)
    prompts, n = [[3, 4, 5, 6, 7, 8, 9], [11, 12]], 5
    out = inf.generate(params, prompts, cfg, max_new_tokens=n, sampler=sampling.greedy())
    seqs, lens = np.zeros((2, 7 + n), np.int64), np.array([7, 2])
    for i, p in enumerate(prompts):
        seqs[i, : len(p)] = p
    for i in range(n):
        logits = np.asarray(forward(params, jnp.asarray(seqs)))
        seqs[[0, 1], lens + i] = logits[[0, 1], lens + i - 1].argmax(-1)
    want = np.stack([seqs[r, lens[r] : lens[r] + n] for r in range(2)])
    np.testing.assert_array_equal(out.tokens, want)


@pytest.mark.parametrize("name", ["orthros_h_gla", "orthros_h_ret"])
def test_sft_output_subset_equals_pt_logits(name):
    cfg, params, forward = _model(name)
    toks = _tokens(cfg, 2, 14, seed=5)
    pt = np.asarray(forward(params, jnp.asarray(toks)))
    idx = np.array([[9, 2, 13, 5], [0, 11, 7, 8]])
    sft = np.asarray(forward(params, jnp.asarray(toks), output_positions=jnp.asarray(idx)))
    np.testing.assert_allclose(sft, pt[np.arange(2)[:, None], idx], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["gla", "retnet"])
def test_packed_documents_equal_separate_rows(name):
    cfg, params, forward = _model(name)
    a, b = _tokens(cfg, 1, 7, seed=6)[0], _tokens(cfg, 1, 6, seed=7)[0]
    packed = np.concatenate([a, b, [0]])[None]
    pos = np.concatenate([np.arange(7), np.arange(6), [0]])[None]
    seg = np.concatenate([np.ones(7), 2 * np.ones(6), [0]])[None].astype(np.int32)
    got = np.asarray(forward(params, jnp.asarray(packed), positions=jnp.asarray(pos),
                             segment_ids=seg))  # fmt: skip
    want_a = np.asarray(forward(params, jnp.asarray(a[None])))[0]
    want_b = np.asarray(forward(params, jnp.asarray(b[None])))[0]
    np.testing.assert_allclose(got[0, :7], want_a, atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[0, 7:13], want_b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", [n for n in sorted(ARMS) if "gdn" not in n])
def test_num_params_counts_the_tree(name):
    cfg = _cfg(name, kinds=dict(gla=dict(output_gate=False), retention=dict(norm_affine=False)))
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    assert num_params(cfg) == sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))


def test_arms_and_fields_validated():
    assert ModelConfig(architecture="gla").layer_types == ("gla",)
    assert ModelConfig(architecture="retnet").layer_types == ("retention",)
    bad = [
        (dict(architecture="gla", layer_types=("gla", "attention")), "architecture 'gla'"),
        (dict(architecture="retnet", layer_types=("gla",)), "architecture 'retnet'"),
        (dict(architecture="hybrid", layer_types=("gla", "retention")), "may stand for gdn"),
        (
            dict(architecture="gla", kinds=dict(gla=dict(heads=4, kv_heads=3))),
            "kinds.gla.heads=4 must be a multiple",
        ),
        (
            dict(architecture="retnet", kinds=dict(retention=dict(feature_map="hedgehog"))),
            "kinds.retention.feature_map='hedgehog'",
        ),
        (
            dict(architecture="retnet", kinds=dict(retention=dict(k_head_dim=5))),
            "kinds.retention.k_head_dim=5 must be even",
        ),
        (dict(architecture="gla", kinds=dict(gla=dict(clamp_min=0.5))), "kinds.gla.clamp_min=0.5"),
        (
            dict(architecture="gla", kinds=dict(gla=dict(gate_normalizer=0.0))),
            "kinds.gla.gate_normalizer must be > 0",
        ),
        (
            dict(architecture="gla", kinds=dict(gla=dict(chunk=0))),
            "kinds.gla.chunk must be a positive int",
        ),
    ]
    for fields, match in bad:
        with pytest.raises(ValueError, match=match):
            ModelConfig(n_layers=4, **fields)
    hyb = ModelConfig(architecture="orthros_h", layer_types=("retention", "attention"))
    assert hyb.two_streams and hyb.layers_of("retention") == 2


def _stack_copies(name: str, kind: str, **kw) -> list[str]:
    cfg = _cfg(name, **kw)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    cache = jax.eval_shape(lambda: inf.init_cache(cfg, 1, 64))
    rec = cache.states[kind].recurrent
    tok, act = jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((1,), bool)
    hlo = drivers.decode_jit.lower(params, cache, tok, act, cfg=cfg).compile().as_text()
    want = "f32[" + ",".join(map(str, rec.shape)) + "]"
    return [ln.strip()[:120] for ln in hlo.splitlines() if want in ln and " copy(" in ln]


@pytest.mark.optimized  # about the compiled program
@pytest.mark.parametrize(
    "name,kind",
    [("retnet", "retention"), ("hybrid_gla", "gla"), ("gdn", "gdn"), ("hybrid_gdn", "gdn")],
)
def test_decode_step_updates_the_stacked_state_in_place(name, kind):
    """The compiled decode step (every layer in one loop) copies the stacked recurrent state
    nowhere, at the bench model's head shape (8 heads of 64 x 64, 8 layers; GDN: 4 key / 8
    value heads of 64)."""
    dims = dict(n_layers=8, d_model=128, kinds=dict(gla=dict(short_conv=False), gdn=dict(num_k_heads=4, num_v_heads=8, k_head_dim=64, v_head_dim=64)))  # fmt: skip
    dims |= {f"{p}_{x}": v for p in ("gla", "retention") for x, v in
             (("heads", 8), ("kv_heads", 8), ("k_head_dim", 64), ("v_head_dim", 64))}  # fmt: skip
    assert _stack_copies(name, kind, **dims) == []
