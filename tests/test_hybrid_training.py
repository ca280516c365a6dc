"""Training the GDN-bearing arms: scan over cycles + remat equal the unrolled step, the PT/SFT
losses, and the sharding rules of the GDN parameters and cache state (the train CLI's resume of
a GDN arm is tests/test_prepared_resume.py)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec
from training_helpers import pt_batch, tiny_model

from orthros_jax.model import OrthrosLM, init_params
from orthros_jax.training import losses

GDN = dict(
    kinds=dict(gdn=dict(num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=8, chunk=8)),
    n_layers=4,
    layer_types=("gdn", "attention"),
)


@pytest.mark.slow
def test_scanned_remat_step_equals_unrolled():
    """orthros_h: scan over (gdn, attention) cycles, remat, both streams and the cross query;
    the single-stream hybrid's layer loop is this one without the output stream. (SFT ≡ PT at
    every position, scanned, for the same cycle: test_kind_conformance's packed-rows case.)"""
    cfg = tiny_model(architecture="orthros_h", remat="full", **GDN)
    unrolled = cfg.replace(scan_layers=False, remat="none")
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    batch = pt_batch(3, batch=2, seq=24)

    @functools.partial(jax.jit, static_argnums=0)
    def grads(c, p):
        return jax.value_and_grad(lambda q: losses.pt_loss(OrthrosLM(c), q, batch))(p)

    (loss, g), (loss_u, g_u) = grads(cfg, params), grads(unrolled, params)
    np.testing.assert_allclose(float(loss), float(loss_u), atol=1e-6, rtol=0)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_u), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)
    gdn = g["gdn_layers"]
    for name in ("gdn_wq", "gdn_a_log", "gdn_conv_v", "w_down"):
        assert float(jnp.abs(gdn[name]).max()) > 0, name
    assert float(jnp.abs(gdn["gdn_so_out_scale"]).max()) > 0  # the cross query's SO trains


@pytest.mark.slow
def test_gdn_params_and_state_shard_by_the_rules():
    """Every GDN parameter and the GDN cache state get their mesh axes from pmesh.RULES
    (an abstract data=2 x fsdp=2 x tensor=2 mesh), and a cache made on a (one-device) mesh
    carries NamedShardings for the GDN state and prefills."""
    from jax.sharding import AbstractMesh

    from orthros_jax import inference as inf
    from orthros_jax.layers import gdn as gdn_layer
    from orthros_jax.model import param_logical_axes
    from orthros_jax.parallel import mesh as pmesh
    from orthros_jax.training import MeshConfig

    cfg = tiny_model(architecture="orthros_h", **GDN | dict(n_layers=2))  # one cycle is enough
    mesh = AbstractMesh((2, 2, 2, 1), pmesh.MESH_AXES)
    logical = param_logical_axes(cfg)["gdn_layers"]
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))["gdn_layers"]
    spec = {n: pmesh.shard_spec(tuple(logical[n]), shapes[n].shape, mesh) for n in shapes}
    P = PartitionSpec
    assert spec["gdn_wq"] == P(None, "fsdp", "tensor")  # [layers, D, Hk, dk]
    assert spec["gdn_wv"] == P(None, "fsdp", "tensor")  # [layers, D, Hv, dv]
    assert spec["gdn_wb"] == P(None, "fsdp", "tensor")  # [layers, D, Hv]
    assert spec["gdn_out"] == P(None, "tensor", None, "fsdp")  # [layers, Hv, dv, D]
    assert spec["gdn_conv_k"] == P(None, None, "tensor")  # [layers, Kc, Hk, dk]
    assert spec["gdn_a_log"] == P(None, "tensor")
    assert spec["gdn_so_out_scale"] == P(None, "tensor")  # [layers, Hk, dk]
    assert spec["w_down"] == P(None, "tensor", "fsdp")
    state = jax.eval_shape(lambda: gdn_layer.init_state(cfg, 2, 4, 16, jnp.float32))
    axes = gdn_layer.state_axes(cfg)
    assert pmesh.shard_spec(axes.recurrent, state.recurrent.shape, mesh) == P(
        None, ("data", "fsdp"), "tensor"
    )
    assert pmesh.shard_spec(axes.conv_v, state.conv_v.shape, mesh) == P(
        None, ("data", "fsdp"), None, "tensor"
    )
    one = pmesh.make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    cache = inf.init_cache(cfg, 2, 16, mesh=one)
    assert cache.states["gdn"].recurrent.sharding.mesh.shape == one.shape
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    toks = np.random.default_rng(1).integers(0, 256, (2, 9))
    lens = np.array([9, 4])
    got, _ = inf.prefill(params, cache, toks, lens, cfg)
    want, _ = inf.prefill(params, inf.init_cache(cfg, 2, 16), toks, lens, cfg)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)
