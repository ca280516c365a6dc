"""Cached inference against the full-sequence (PT) forward, generation, compiles, validation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import randomize_so, single_stream, tiny_config

from orthros_jax import inference as inf
from orthros_jax.config import ModelConfig
from orthros_jax.inference import drivers as fwd
from orthros_jax.inference import sampling
from orthros_jax.kernels.few_queries import few_query_attention
from orthros_jax.model import OrthrosLM, init_params

ARCHS = ("orthros", "transformer", "swa")
WINDOW, CHUNK = 6, 8
# Ragged prompt lengths: 1, < w, = w, > w spanning three chunks of 8 (8 does not divide 21).
LENGTHS = np.array([1, 4, WINDOW, 21])
N_DECODE = 5
ATOL = 1e-5


def _cfg(arch: str, **kw) -> ModelConfig:
    base = dict(
        vocab_size=61,
        window=WINDOW,
        architecture=arch,
        prefill_chunk=CHUNK,
        attention_block_q=8,
        attention_block_k=8,
        init_std=0.1,
    )
    return tiny_config(**(base | kw))


@functools.cache
def _model(arch: str, **kw):
    """(cfg, params, jitted PT forward). Orthros gets non-identity SO so the streams differ."""
    cfg = _cfg(arch, **kw)
    if arch != "orthros":  # one parameter layout: the orthros params minus the SO vectors
        return cfg, single_stream(_model("orthros", **kw)[1]), _forward(cfg)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    if cfg.two_streams:
        params = randomize_so(params, 10, 0.3)
    return cfg, params, _forward(cfg)


def _forward(cfg: ModelConfig):
    return jax.jit(lambda p, t: OrthrosLM(cfg).apply({"params": p}, t))


def _tokens(cfg: ModelConfig, bsz: int, t: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (bsz, t))


# Prefill + decode against the forward: test_oracle (against the float64 oracle, every arm of
# this file) and test_kind_conformance (every kind and layout).


@pytest.mark.slow
def test_variant_config_and_continued_prefill_match_pt_forward():
    # qk-norm, tied embeddings, a Python layer loop, window 3; the prompt is prefilled in two
    # calls (the second continues after the cache's contents) and the first ends mid-window.
    cfg, params, forward = _model(
        "orthros", qk_norm=True, tie_embeddings=True, scan_layers=False, window=3
    )
    full = _tokens(cfg, 2, 20, seed=3)
    want = np.asarray(forward(params, jnp.asarray(full)))
    cache = inf.init_cache(cfg, 2, 24)
    first = np.array([5, 11])
    _, cache = inf.prefill(params, cache, full[:, :11], first, cfg)
    rest = np.zeros((2, 9), np.int64)
    rest[0, :9], rest[1, :7] = full[0, 5:14], full[1, 11:18]
    logits, cache = inf.prefill(params, cache, rest, np.array([9, 7]), cfg)
    np.testing.assert_allclose(np.asarray(logits), want[[0, 1], [13, 17]], atol=ATOL, rtol=0)
    logits, cache = inf.decode_step(params, cache, full[[0, 1], [14, 18]], cfg)
    np.testing.assert_allclose(np.asarray(logits), want[[0, 1], [14, 18]], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(cache.lengths), [15, 19])  # 5 + 9 + 1, 11 + 7 + 1


def _greedy_reference(forward, params, prompts: list[list[int]], n: int, width: int) -> np.ndarray:
    """Step-by-step argmax of the full forward (no cache), [B, n]. Rows are right-padded to a
    fixed width (causal: padding after a position never changes its logits), so one compile."""
    seqs = np.zeros((len(prompts), width), np.int64)
    lens = np.array([len(p) for p in prompts])
    for i, p in enumerate(prompts):
        seqs[i, : len(p)] = p
    rows = np.arange(len(prompts))
    for i in range(n):
        logits = np.asarray(forward(params, jnp.asarray(seqs)))
        nxt = logits[rows, lens + i - 1].argmax(-1)
        if i + 1 < n:
            seqs[rows, lens + i] = nxt
    return np.concatenate([seqs[rows[:, None], lens[:, None] + np.arange(n - 1)], nxt[:, None]], 1)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generate_matches_pt_argmax(arch):
    cfg, params, forward = _model(arch)
    full = _tokens(cfg, len(LENGTHS), LENGTHS.max(), seed=1)
    prompts = [list(full[i, :n]) for i, n in enumerate(LENGTHS)]
    n_new = N_DECODE + 1
    out = inf.generate(
        params, prompts, cfg, max_new_tokens=n_new, sampler=sampling.greedy(), cache_size=37
    )
    np.testing.assert_array_equal(out.lengths, n_new)
    assert not out.hit_capacity.any()
    want = _greedy_reference(forward, params, prompts, n_new, LENGTHS.max() + N_DECODE)
    np.testing.assert_array_equal(out.tokens, want)


@pytest.mark.slow
def test_generate_stops_per_row_and_at_capacity():
    cfg, params, _ = _model("orthros")
    full = _tokens(cfg, len(LENGTHS), LENGTHS.max(), seed=1)
    prompts = [list(full[i, :n]) for i, n in enumerate(LENGTHS)]
    free = inf.generate(params, prompts, cfg, max_new_tokens=6, cache_size=37)
    # Row 0 stops at its third token (a per-row stop list); the other rows run on.
    stop = int(free.tokens[0, 2])
    per_row = [[stop]] + [[] for _ in prompts[1:]]
    out = inf.generate(params, prompts, cfg, max_new_tokens=6, stop_tokens=per_row, cache_size=37)
    first = list(free.tokens[0]).index(stop) + 1
    assert out.lengths[0] == first
    assert out.tokens[0, :first].tolist() == free.tokens[0, :first].tolist()
    assert (out.tokens[0, first:] == -1).all()
    np.testing.assert_array_equal(out.tokens[1:], free.tokens[1:])
    # A 23-slot cache: the 21-token row can feed 2 more tokens, so it stops after 3 and says
    # so. Its prompt bucket (24) is longer than the cache: the padding's writes are dropped.
    out = inf.generate(params, prompts, cfg, max_new_tokens=6, cache_size=23)
    np.testing.assert_array_equal(out.lengths, [6, 6, 6, 3])
    np.testing.assert_array_equal(out.hit_capacity, [False, False, False, True])
    np.testing.assert_array_equal(out.tokens[:3], free.tokens[:3])
    assert out.tokens[3, :3].tolist() == free.tokens[3, :3].tolist()
    assert (out.tokens[3, 3:] == -1).all()


def test_prefill_compiles_once_per_bucket():
    cfg, params, _ = _model("orthros")  # [2, 16] prompts, 32 slots: shapes no other test uses
    assert inf.prompt_bucket(9, cfg) == inf.prompt_bucket(15, cfg) == 16
    before = fwd.prefill_jit._cache_size()
    for n in (9, 15):
        cache = inf.init_cache(cfg, 2, 32)
        toks = _tokens(cfg, 2, n)
        logits, _ = inf.prefill(params, cache, toks, np.array([n, n - 3]), cfg)
        logits.block_until_ready()
    assert fwd.prefill_jit._cache_size() - before == 1


def test_invalid_inputs_raise_before_compiling():
    cfg, params, _ = _model("orthros")
    compiled = (fwd.prefill_jit._cache_size(), fwd.decode_jit._cache_size())
    cache = inf.init_cache(cfg, 2, 16)
    ok = np.zeros((2, 4), np.int64)
    cases = [
        (
            "needs 17 cache slots",
            lambda: inf.prefill(params, cache, np.zeros((2, 17), int), [17, 2], cfg),
        ),
        ("token id 61", lambda: inf.prefill(params, cache, ok + 61, [4, 4], cfg)),
        ("token id -1", lambda: inf.prefill(params, cache, ok - 1, [4, 4], cfg)),
        ("empty prompt", lambda: inf.prefill(params, cache, ok, [4, 0], cfg)),
        ("batch size", lambda: inf.prefill(params, cache, np.zeros((3, 4), int), [4, 4, 4], cfg)),
        ("batch size", lambda: inf.prefill(params, cache, ok, [4], cfg)),
        ("exceed the 4 tokens", lambda: inf.prefill(params, cache, ok, [4, 5], cfg)),
        ("integer array", lambda: inf.prefill(params, cache, ok + 0.5, [4, 4], cfg)),
        ("token id 61", lambda: inf.decode_step(params, cache, [1, 61], cfg)),
        ("2 rows", lambda: inf.decode_step(params, cache, [1, 2, 3], cfg)),
        ("empty", lambda: inf.generate(params, [[1], []], cfg, max_new_tokens=2)),
        ("max_new_tokens", lambda: inf.generate(params, [[1]], cfg, max_new_tokens=0)),
        (
            "cache_size=8",
            lambda: inf.generate(params, [[1] * 9], cfg, max_new_tokens=1, cache_size=8),
        ),
        ("token id 70", lambda: inf.generate(params, [[70]], cfg, max_new_tokens=1)),
        (
            "stop_tokens",
            lambda: inf.generate(params, [[1]], cfg, max_new_tokens=1, stop_tokens=[-3]),
        ),
        ("non-empty list", lambda: inf.generate(params, [1, 2], cfg, max_new_tokens=1)),
        (
            "this config needs",
            lambda: inf.prefill(params, cache, ok, [1, 1], cfg.replace(n_layers=3)),
        ),
    ]
    for match, call in cases:
        with pytest.raises(ValueError, match=match):
            call()
    full = cache.replace(lengths=jnp.asarray([16, 3], jnp.int32))
    with pytest.raises(ValueError, match="row 0 is full"):
        inf.decode_step(params, full, [1, 2], cfg)
    assert (fwd.prefill_jit._cache_size(), fwd.decode_jit._cache_size()) == compiled


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cached_attention_kernel_matches_reference(dtype):
    # The decode kernel over the head-major cache: two queries per row with their own masks.
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (2, 2, 4, 8)).astype(dtype)
    k, v = (jax.random.normal(kk, (2, 2, 11, 8)).astype(dtype) for kk in keys[1:])
    visible = np.zeros((2, 2, 11), bool)
    visible[0, 0, :3], visible[0, 1, 2:9], visible[1, 0, :11], visible[1, 1, 5:6] = (
        True,
        True,
        True,
        True,
    )
    got = jax.jit(few_query_attention)(q, k, v, jnp.asarray(visible))
    qf, kf, vf = (np.asarray(a, np.float32) for a in (q, k, v))
    kf, vf = np.repeat(kf, 2, axis=1), np.repeat(vf, 2, axis=1)  # GQA: K=2 -> N=4
    s = np.einsum("bqnh,bnsh->bnqs", qf, kf) / np.sqrt(8)
    s = np.where(visible[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bnqs,bnsh->bqnh", p / p.sum(-1, keepdims=True), vf)
    atol = 1e-5 if dtype == jnp.float32 else 3e-2
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=atol, rtol=0)
