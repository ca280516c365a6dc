"""Mixture-of-experts arms end to end: paired routing's invariants, SFT copies, prefill+decode
against the PT forward, the training loss's auxiliary terms, parameter counts."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import randomize_so, single_stream, tiny_config

from orthros_jax import inference as inf
from orthros_jax.kernels import moe as kmoe
from orthros_jax.layers import moe
from orthros_jax.model import OrthrosLM, init_params, num_params
from orthros_jax.training import losses

# A dense layer before a MoE one (the last layer: paired routing runs its base stream too),
# top-2 of 4 experts, a shared expert.
MOE = dict(n_experts=4, top_k=2, d_expert=24, shared_expert=16, ffn_cycle=("dense", "moe"))
WINDOW, CHUNK = 6, 8
LENGTHS = np.array([1, 4, WINDOW, 21])
N_DECODE = 4


def _cfg(arch: str, window: int = WINDOW, **moe_kw):
    return tiny_config(
        vocab_size=61,
        window=window,
        architecture=arch,
        prefill_chunk=CHUNK,
        attention_block_q=8,
        attention_block_k=8,
        init_std=0.15,
        moe=MOE | moe_kw,
    )


@functools.cache
def _params(window: int = WINDOW, so: bool = True):
    cfg = _cfg("orthros", window)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    return randomize_so(params, 10, 0.3) if so else params


@functools.cache
def _jitted(cfg):
    return jax.jit(lambda p, t, **kw: OrthrosLM(cfg).apply({"params": p}, t, **kw))


def _forward(cfg, params, tokens, **kw):
    return np.asarray(_jitted(cfg)(params, jnp.asarray(tokens), **kw))


def _tokens(n, t, seed=0):
    return np.random.default_rng(seed).integers(0, 61, (n, t))


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["grouped", pytest.param("dense", marks=pytest.mark.slow)])
def test_paired_orthros_with_global_window_and_identity_so_is_the_transformer(impl):
    # window >= T and identity SO: a converted MoE model reproduces its source exactly.
    t = 12
    params = _params(window=t, so=False)
    tokens = _tokens(2, t)
    orthros = _forward(_cfg("orthros", t, impl=impl), params, tokens)
    source = _forward(_cfg("transformer", t, impl=impl), single_stream(params), tokens)
    np.testing.assert_allclose(orthros, source, atol=2e-5, rtol=0)


@pytest.mark.slow
def test_copies_use_their_base_tokens_experts():
    r = np.random.default_rng(0)
    cfg = _cfg("orthros", shared_expert=0)
    p = jax.tree.map(
        lambda a: a[0], jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(2))["moe"]
    )  # one MoE layer's parameters
    h_base = jnp.asarray(r.normal(size=(2, 7, cfg.d_model)), jnp.float32)
    h_out = jnp.asarray(r.normal(size=(2, 3, cfg.d_model)), jnp.float32)
    idx = jnp.asarray([[0, 4, 6], [2, 2, 5]], jnp.int32)
    ffn = jax.jit(moe.moe_ffn, static_argnums=1)  # eagerly it dispatches op by op
    _, y_out, _ = ffn(p, cfg, h_base, h_out, idx)
    probs_b = kmoe.router_probs(h_base @ p["router"])
    _, experts_b = kmoe.top_k_route(probs_b, 2, True, jnp.float32)
    want_experts = np.take_along_axis(np.asarray(experts_b), np.asarray(idx)[..., None], 1)
    probs_o = kmoe.router_probs(h_out @ p["router"])
    gates = kmoe.paired_gates(probs_o, jnp.asarray(want_experts), True, jnp.float32)
    flat = lambda a: a.reshape(6, -1)
    want = kmoe.experts_dense(
        flat(h_out),
        p["w_gate"],
        p["w_up"],
        p["w_down"],
        flat(gates),
        flat(jnp.asarray(want_experts)),
    )
    np.testing.assert_allclose(np.asarray(y_out).reshape(6, -1), want, atol=1e-5, rtol=0)
    # independent routing picks the copies' own experts: a different output here
    ind = cfg.replace(moe=cfg.moe.replace(routing="independent"))
    _, y_ind, _ = ffn(p, ind, h_base, h_out, idx)
    assert np.abs(np.asarray(y_ind) - np.asarray(y_out)).max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("routing", ["paired", "independent"])
def test_sft_copies_equal_pt_at_their_positions(routing):
    cfg = _cfg("orthros", routing=routing)
    params = _params()
    tokens = _tokens(2, 14, seed=1)
    pt = _forward(cfg, params, tokens)
    idx = np.array([[3, 7, 13], [0, 5, 9]])
    sft = _forward(cfg, params, tokens, output_positions=jnp.asarray(idx))
    np.testing.assert_allclose(sft, np.take_along_axis(pt, idx[..., None], 1), atol=2e-5)


@pytest.mark.slow
def test_paired_and_independent_routing_differ_with_trained_so():
    params, tokens = _params(), _tokens(2, 14, seed=2)
    paired = _forward(_cfg("orthros"), params, tokens)
    ind = _forward(_cfg("orthros", routing="independent"), params, tokens)
    assert np.abs(paired - ind).max() > 1e-4


@pytest.mark.slow
def test_single_stream_prefill_then_decode_matches_pt_forward():
    """The Transformer-MoE arm; the two-stream MoE arms (paired and independent routing) are
    test_kind_conformance's MoE cases."""
    cfg = _cfg("transformer", routing=None)
    params = single_stream(_params())
    bsz, rows = len(LENGTHS), np.arange(len(LENGTHS))
    full = _tokens(bsz, LENGTHS.max() + N_DECODE, seed=3)
    want = _forward(cfg, params, full)
    prompts = np.where(np.arange(full.shape[1])[None] < LENGTHS[:, None], full, -1)
    cache = inf.init_cache(cfg, bsz, 33)
    logits, cache = inf.prefill(params, cache, prompts, LENGTHS, cfg)
    np.testing.assert_allclose(np.asarray(logits), want[rows, LENGTHS - 1], atol=2e-5, rtol=0)
    for i in range(N_DECODE):
        logits, cache = inf.decode_step(params, cache, full[rows, LENGTHS + i], cfg)
        np.testing.assert_allclose(np.asarray(logits), want[rows, LENGTHS + i], atol=2e-5, rtol=0)


@pytest.mark.slow
def test_training_loss_adds_the_auxiliary_terms():
    cfg = _cfg("orthros", aux_loss_coef=0.01, z_loss_coef=0.001)
    params = _params()
    tokens = _tokens(2, 10, seed=4)
    seg = np.ones((2, 10), np.int32)
    seg[1, 7:] = 0  # padding: not routed for the statistics
    batch = dict(
        tokens=tokens,
        positions=np.tile(np.arange(10), (2, 1)),
        segment_ids=seg,
        targets=_tokens(2, 10, seed=5),
        loss_mask=(seg > 0).astype(np.float32),
    )
    model = OrthrosLM(cfg)

    # One jitted program for the plain and chunked losses, the routing statistics and the
    # router's gradient (eagerly, each re-traces and dispatches op by op).
    @jax.jit
    def run(p):
        loss, aux = losses.mean_loss(model, p, batch)
        chunked = losses.mean_loss(model, p, batch, loss_chunk=4)
        stats = losses.logits_and_moe_stats(model, p, batch)[1]
        grads = jax.grad(lambda q: losses.mean_loss(model, q, batch)[0])(p)
        return loss, aux, chunked, stats, grads["moe"]["router"]

    loss, aux, (chunked, aux_c), stats, router_grad = run(params)
    ce = aux["loss_sum"] / aux["weight"]
    want = ce + 0.01 * aux["moe_balance_loss"] + 0.001 * aux["moe_z_loss"]
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)
    # the chunked cross-entropy (train.loss_chunk) adds the same terms: the forward sows them
    np.testing.assert_allclose(float(chunked), float(loss), rtol=1e-6)
    for k in ("moe_balance_loss", "moe_z_loss", "moe_load"):
        np.testing.assert_allclose(np.asarray(aux_c[k]), np.asarray(aux[k]), rtol=1e-6)
    # statistics: both streams' 17 valid tokens in each MoE layer, k = 2 choices each
    routed = cfg.ffn_layers("moe") * 2 * 17
    assert float(stats["tokens"]) == routed
    np.testing.assert_allclose(np.asarray(stats["count"]).sum(), routed * 2)
    count = np.asarray(stats["count"]).sum(0)  # the metric is each expert's share of the pairs
    np.testing.assert_allclose(np.asarray(aux["moe_load"]), count / count.sum(), rtol=1e-6)
    assert float(jnp.abs(router_grad).sum()) > 0


def test_parameter_counts_total_and_active():
    cfg = _cfg("orthros")
    params = _params()
    assert num_params(cfg) == sum(a.size for a in jax.tree.leaves(params))
    d, m = cfg.d_model, cfg.moe
    idle = (m.n_experts - m.top_k) * 3 * d * m.d_expert * cfg.ffn_layers("moe")
    assert num_params(cfg, active=True) == num_params(cfg) - idle
