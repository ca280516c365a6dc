"""Mixture-of-experts math (kernels/moe.py) against float64 NumPy oracles and transformers'
load-balancing loss; MoEOptions' refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import validated

from orthros_jax.config import ModelConfig
from orthros_jax.config.moe import MOE_IMPLS
from orthros_jax.kernels import moe as kmoe

N, D, E, K, F = 13, 8, 5, 2, 6  # F: an expert's width (I in kernels/moe.py)


def _softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _oracle(x, wg, wu, wd, logits, k, normalize, experts=None):
    """Float64 per-token loop: own top-k (or the given experts), gates, sum of expert SwiGLUs."""
    probs = _softmax(logits.astype(np.float64))
    out = np.zeros((x.shape[0], x.shape[1]))
    for n in range(x.shape[0]):
        chosen = np.argsort(-probs[n], kind="stable")[:k] if experts is None else experts[n]
        g = probs[n, chosen]
        g = g / g.sum() if normalize else g
        for e, w in zip(chosen, g, strict=True):
            h = x[n] @ wg[e]
            h = h / (1 + np.exp(-h)) * (x[n] @ wu[e])
            out[n] += w * (h @ wd[e])
    return out


def _weights(seed=0):
    r = np.random.default_rng(seed)
    return (
        r.normal(size=(N, D)),
        r.normal(size=(E, D, F)) / 3,
        r.normal(size=(E, D, F)) / 3,
        r.normal(size=(E, F, D)) / 3,
        r.normal(size=(N, E)),
    )


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("impl", MOE_IMPLS)
def test_experts_match_float64_oracle(impl, normalize):
    x, wg, wu, wd, logits = _weights()
    probs = kmoe.router_probs(jnp.asarray(logits, jnp.float32))
    gates, experts = kmoe.top_k_route(probs, K, normalize, jnp.float32)
    args = [jnp.asarray(a, jnp.float32) for a in (x, wg, wu, wd)]
    got = kmoe.experts(impl, *args, gates, experts)
    want = _oracle(x, wg, wu, wd, logits, K, normalize)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", MOE_IMPLS)
def test_expert_slices_sum_to_all_experts(impl):
    """Expert parallelism's per-device call: the weights of experts first .. first + E' - 1
    alone give those experts' share; the shares of a split of E add up to the whole, and a
    slice no token chose gives zeros."""
    x, wg, wu, wd, logits = _weights(1)
    probs = kmoe.router_probs(jnp.asarray(logits, jnp.float32))
    gates, experts = kmoe.top_k_route(probs, K, True, jnp.float32)
    x, wg, wu, wd = (jnp.asarray(a, jnp.float32) for a in (x, wg, wu, wd))
    whole = kmoe.experts(impl, x, wg, wu, wd, gates, experts)
    cuts = (0, 2, 3, E)  # uneven slices: 2, 1 and 2 experts
    parts = [
        kmoe.experts(impl, x, wg[a:b], wu[a:b], wd[a:b], gates, experts, first=a)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
    ]
    np.testing.assert_allclose(np.asarray(sum(parts)), np.asarray(whole), atol=1e-5, rtol=1e-5)
    assert all(float(jnp.max(jnp.abs(p))) > 0 for p in parts)
    unchosen = jnp.full_like(experts, E - 1).at[:, 1].set(E - 2)  # nobody routes to 0 .. 2
    none = kmoe.experts(impl, x, wg[:3], wu[:3], wd[:3], gates, unchosen, first=0)
    np.testing.assert_array_equal(np.asarray(none), 0.0)


def test_grouped_equals_dense_with_empty_and_crowded_experts_and_grads():
    # Every token picks experts 0 and 3 (1, 2, 4 get no token): groups of 0 and of N.
    x, wg, wu, wd, _ = _weights(1)
    experts = jnp.tile(jnp.array([[3, 0]], jnp.int32), (N, 1))
    gates = jnp.asarray(np.random.default_rng(2).uniform(size=(N, K)), jnp.float32)
    args = [jnp.asarray(a, jnp.float32) for a in (x, wg, wu, wd)]
    f = lambda impl: lambda *a: jnp.sum(kmoe.experts(impl, *a, gates, experts) ** 2)
    np.testing.assert_allclose(f("grouped")(*args), f("dense")(*args), rtol=1e-5)
    g_grouped = jax.grad(f("grouped"), argnums=(0, 1, 3))(*args)
    g_dense = jax.grad(f("dense"), argnums=(0, 1, 3))(*args)
    for a, b in zip(g_grouped, g_dense, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("normalize", [True, False])
def test_paired_gates_use_given_experts_with_own_probabilities(normalize):
    x, wg, wu, wd, logits = _weights(3)
    base = np.random.default_rng(4).normal(size=(N, E))
    _, experts_b = kmoe.top_k_route(kmoe.router_probs(jnp.asarray(base)), K, normalize, jnp.float32)
    probs = kmoe.router_probs(jnp.asarray(logits, jnp.float32))
    gates = kmoe.paired_gates(probs, experts_b, normalize, jnp.float32)
    args = [jnp.asarray(a, jnp.float32) for a in (x, wg, wu, wd)]
    got = kmoe.experts("grouped", *args, gates, experts_b)
    want = _oracle(x, wg, wu, wd, logits, K, normalize, experts=np.asarray(experts_b))
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-5)
    # with its own logits equal to the base's, a copy's gates are the base's own
    pb = kmoe.router_probs(jnp.asarray(base))
    own, _ = kmoe.top_k_route(pb, K, normalize, jnp.float32)
    same = kmoe.paired_gates(pb, experts_b, normalize, jnp.float32)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(own))


def test_aux_losses_match_transformers_and_float64():
    import torch
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    r = np.random.default_rng(5)
    layers = [r.normal(size=(N, E)).astype(np.float32) for _ in range(3)]
    stats, chosen = None, []
    for lg in layers:
        probs = kmoe.router_probs(jnp.asarray(lg))
        _, experts = kmoe.top_k_route(probs, K, True, jnp.float32)
        chosen.append(np.asarray(experts).ravel())
        s = kmoe.router_stats(jnp.asarray(lg), probs, experts, jnp.ones((N,), bool))
        stats = s if stats is None else jax.tree.map(jnp.add, stats, s)
    want = load_balancing_loss_func(tuple(torch.tensor(a) for a in layers), E, K)
    np.testing.assert_allclose(float(kmoe.load_balancing_loss(stats)), float(want), rtol=1e-5)
    lse = [np.log(np.exp(a.astype(np.float64)).sum(-1)) for a in layers]
    z = np.mean(np.concatenate(lse) ** 2)
    np.testing.assert_allclose(float(kmoe.z_loss(stats)), z, rtol=1e-5)
    # each expert's share of the (token, choice) pairs, counted from the routing decisions
    want_load = np.bincount(np.concatenate(chosen), minlength=E) / (len(layers) * N * K)
    np.testing.assert_allclose(np.asarray(kmoe.expert_load(stats)), want_load, rtol=1e-6)
    # masked tokens are left out, as transformers' attention_mask leaves them out
    mask = np.ones((1, N), np.int64)
    mask[0, -4:] = 0
    masked = None
    for lg in layers:
        probs = kmoe.router_probs(jnp.asarray(lg))
        _, experts = kmoe.top_k_route(probs, K, True, jnp.float32)
        s = kmoe.router_stats(jnp.asarray(lg), probs, experts, jnp.asarray(mask[0] > 0))
        masked = s if masked is None else jax.tree.map(jnp.add, masked, s)
    want_m = load_balancing_loss_func(
        tuple(torch.tensor(a) for a in layers), E, K, attention_mask=torch.tensor(mask)
    )
    np.testing.assert_allclose(float(kmoe.load_balancing_loss(masked)), float(want_m), rtol=1e-5)


@pytest.mark.parametrize(
    "moe, arch, field",
    [
        ({"top_k": 9, "n_experts": 8}, "orthros", "moe.top_k"),
        ({"routing": "paired"}, "transformer", "moe.routing"),
        ({"routing": "sticky"}, "orthros", "moe.routing"),
        ({"impl": "megablox"}, "orthros", "moe.impl"),
        ({"ffn_cycle": ("dense",)}, "orthros", "moe.ffn_cycle"),
        ({"ffn_cycle": ("moe", "ssm")}, "orthros", "moe.ffn_cycle"),
        ({"ffn_cycle": ("moe", "dense", "moe")}, "orthros", "moe.ffn_cycle"),  # 3 !| 4 layers
        ({"router_jitter": 0.1}, "orthros", "router_jitter"),
        ({"aux_loss_coef": -1.0}, "orthros", "moe.aux_loss_coef"),
        ({"routing": "paired"}, "orthros_h", "moe.routing"),
    ],
)
def test_bad_moe_options_raise_naming_the_field(moe, arch, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")) as err:
        validated(architecture=arch, n_layers=4, moe=moe)
    assert "\n" not in str(err.value)


def test_moe_config_round_trips_through_json_and_extends_the_cycle():
    import json

    cfg = ModelConfig(n_layers=4, moe={"ffn_cycle": ["dense", "moe"], "shared_expert": 8})
    assert cfg.layer_types == ("attention", "attention") and cfg.ffn_types == ("dense", "moe")
    assert (cfg.ffn_layers("moe"), cfg.ffn_layers("dense")) == (2, 2)
    assert [cfg.ffn_index(c, 1) for c in range(2)] == [0, 1]
    back = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and hash(back) == hash(cfg)
    assert cfg.flat()["moe.shared_expert"] == 8 and "moe.impl" in cfg.runtime_keys()
    assert cfg.moe_routing == "paired"
    assert ModelConfig(architecture="transformer", moe={}).moe_routing == "independent"
