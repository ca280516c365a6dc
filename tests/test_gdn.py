"""The gated DeltaNet mixer: chunked form vs the float64 token-by-token reference
(oracle_gdn.py) with a carried state, padding and document resets, the Orthros-H cross stream,
gradients, and parity with transformers' Qwen3_5GatedDeltaNet (torch fallback kernels, fp32,
CPU). Split calls, decode and packed documents through the model: test_kind_conformance.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import oracle  # noqa: F401  (before oracle_gdn: oracle.py imports it back to register its kind)
import pytest
from helpers import tiny_config
from oracle_gdn import gdn_mix_reference

from orthros_jax.axes import CONV_KERNEL, GDN_K_HEADS, GDN_V_HEADS
from orthros_jax.config import ModelConfig
from orthros_jax.convert.gdn_hf import HF_NAMES, gdn_to_hf, hf_to_gdn
from orthros_jax.layers.gdn_mixer import (
    GDNState,
    gdn_decode,
    gdn_mix,
    gdn_params,
    init_gdn_state,
)

# Hk 2, Hv 4 (each key head serves two value heads), dk 8 != dv 6, conv kernel 4, chunk 8;
# two layers (gdn_out's depth scaling).
CFG = tiny_config(
    architecture="gdn",
    d_model=16,
    kinds=dict(gdn=dict(k_head_dim=8, v_head_dim=6, conv_kernel=4, chunk=8)),
)
mix = jax.jit(gdn_mix, static_argnums=(2,), static_argnames=("cross_silu",))
TOL = {"atol": 1e-5, "rtol": 1e-5}


def random_params(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Random weights large enough that every path matters (decays between ~0.02 and ~4)."""
    rng = np.random.default_rng(seed)
    p = {
        n: rng.normal(0, 0.3, s).astype(np.float32)
        for n, d in gdn_params(cfg).items()
        for s in [d.shape]
    }
    hv = cfg.kinds.gdn.num_v_heads
    p["gdn_a_log"] = np.log(rng.uniform(0.05, 2.0, hv)).astype(np.float32)
    p["gdn_dt_bias"] = rng.normal(0, 1, hv).astype(np.float32)
    p["gdn_norm"] = (1 + 0.3 * rng.normal(size=cfg.kinds.gdn.v_head_dim)).astype(np.float32)
    return p


def random_state(cfg: ModelConfig, batch: int, seed: int) -> GDNState:
    rng = np.random.default_rng(seed)
    empty = init_gdn_state(cfg, batch)
    return jax.tree.map(lambda x: jnp.asarray(0.5 * rng.normal(size=x.shape), jnp.float32), empty)


def random_so(cfg: ModelConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (cfg.kinds.gdn.num_k_heads, cfg.kinds.gdn.k_head_dim)
    scale = rng.normal(1, 0.3, shape).astype(np.float32)
    return scale, rng.normal(0, 0.3, shape).astype(np.float32)


def assert_state_close(got: GDNState, want: GDNState | dict, **tol) -> None:
    for name in ("conv_q", "conv_k", "conv_v", "recurrent"):
        ref = want[name] if isinstance(want, dict) else getattr(want, name)
        np.testing.assert_allclose(np.asarray(getattr(got, name)), ref, err_msg=name, **tol)


def ragged_masks(b: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Row 0 full, row 1 right-padded, row 2 with holes; resets inside rows 0 and 2."""
    valid = np.ones((b, seq), bool)
    valid[1, 20:] = False
    valid[2, [3, 4, 10, 17, 18, 19, seq - 1]] = False
    reset = np.zeros((b, seq), bool)
    reset[0, [11, 16]] = True  # two documents start mid-row, 11 is not on a chunk boundary
    reset[2, [5, 17]] = True  # 17 is padding: ignored
    reset[1, 8] = True
    return valid, reset


@pytest.mark.parametrize(
    "cross,so,cross_silu,with_state",
    [(True, True, True, True), (True, False, False, False)],
)
def test_chunked_matches_reference(cross: bool, so: bool, cross_silu: bool, with_state: bool):
    """Chunk 8 over 29 tokens (not a multiple), Hv = 2 Hk, dk != dv, ragged padding, resets."""
    b, seq = 3, 29
    rng = np.random.default_rng(1)
    p = random_params(CFG, 0)
    h = rng.normal(size=(b, seq, CFG.d_model)).astype(np.float32)
    cross_h = rng.normal(size=h.shape).astype(np.float32) if cross else None
    cross_so = random_so(CFG, 2) if so else None
    state = random_state(CFG, b, 3) if with_state else None
    valid, reset = ragged_masks(b, seq)
    kw = dict(
        state=state,
        valid_BL=valid,
        reset_BL=reset,
        cross_h_BLD=cross_h,
        cross_so=cross_so,
        cross_silu=cross_silu,
    )
    y, cross_y, new_state = mix(p, h, CFG, **kw)
    ref_y, ref_cross, ref_state = gdn_mix_reference(p, h, CFG, **kw)
    assert np.abs(ref_y).max() > 1.0  # the comparison is on outputs of order one
    np.testing.assert_allclose(np.asarray(y), ref_y, **TOL)
    np.testing.assert_array_equal(np.asarray(y)[~valid], 0.0)
    if cross:
        np.testing.assert_allclose(np.asarray(cross_y), ref_cross, **TOL)
        assert np.abs(ref_cross - ref_y).max() > 0.1  # the cross stream is its own stream
    else:
        assert cross_y is None
    assert_state_close(new_state, ref_state, **TOL)


# The cross-query test's compiled signature: [1, 30] with state, masks, cross stream, SO.
SEQ = 30


def single_row_call(p, h, cross_h, state, valid=None, reset=None):
    valid = np.ones((1, SEQ), bool) if valid is None else valid
    reset = np.zeros((1, SEQ), bool) if reset is None else reset
    shape = (CFG.kinds.gdn.num_k_heads, CFG.kinds.gdn.k_head_dim)
    identity = (np.ones(shape, np.float32), np.zeros(shape, np.float32))
    return mix(
        p,
        h,
        CFG,
        state=state,
        valid_BL=valid,
        reset_BL=reset,
        cross_h_BLD=cross_h,
        cross_so=identity,
    )


def test_cross_query_equals_base_query_when_conv_is_identity():
    """With the conv reduced to its current-token tap (weight 1), identity SO and SiLU on the
    cross query, an output copy with the base token's hidden state reproduces the base
    output: it reads the base state after its own token with the same normalisation."""
    p = random_params(CFG, 10)
    for key in "qkv":
        w = np.zeros_like(p[f"gdn_conv_{key}"])
        w[-1] = 1.0
        p[f"gdn_conv_{key}"] = w
    h = np.random.default_rng(11).normal(size=(1, SEQ, CFG.d_model)).astype(np.float32)
    y, cross_y, _ = single_row_call(p, h, h, init_gdn_state(CFG, 1))
    np.testing.assert_allclose(np.asarray(cross_y), np.asarray(y), atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_gradients_match_float64_finite_differences():
    """Training differentiates the chunked form: for each parameter (and the input), the
    derivative of a loss over both streams and the final state along a random direction
    equals the float64 reference's central finite difference."""
    b, seq = 2, 12
    rng = np.random.default_rng(13)
    p = random_params(CFG, 14)
    h, cross_h, probe = (rng.normal(size=(b, seq, CFG.d_model)) for _ in range(3))
    valid = np.ones((b, seq), bool)
    valid[1, 9:] = False
    so = random_so(CFG, 15)
    kw = dict(valid_BL=valid, cross_h_BLD=cross_h.astype(np.float32), cross_so=so)

    def loss(p, h):
        y, cy, s = gdn_mix(p, h, CFG, **kw)
        return jnp.sum((y + cy) * probe) + jnp.sum(s.recurrent)

    def loss_ref(p, h):
        y, cy, s = gdn_mix_reference(p, h, CFG, **{**kw, "cross_h_BLD": cross_h})
        return np.sum((y + cy) * probe) + np.sum(s["recurrent"])

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(p, h.astype(np.float32))
    eps = 1e-5  # float64 central differences: truncation error ~1e-5 relative at 1e-4
    for name in [*p, "h"]:
        grad = grads[1] if name == "h" else grads[0][name]
        x = h if name == "h" else p[name].astype(np.float64)
        step = rng.normal(size=x.shape)

        def at(sign: float) -> float:
            moved = x + sign * eps * step
            return loss_ref(p, moved) if name == "h" else loss_ref({**p, name: moved}, h)

        want = (at(1.0) - at(-1.0)) / (2 * eps)
        got = float(np.sum(np.asarray(grad, np.float64) * step))
        assert abs(want) > 1e-2, name  # the direction moves the loss
        np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=name)


def test_param_shapes_axes_and_init():
    decls = gdn_params(CFG)
    shapes = {n: (d.shape, d.axes) for n, d in decls.items()}
    assert shapes["gdn_wq"] == ((16, 2, 8), ("embed", GDN_K_HEADS, "head_dim"))
    assert shapes["gdn_wz"] == ((16, 4, 6), ("embed", GDN_V_HEADS, "head_dim"))
    assert shapes["gdn_conv_v"] == ((4, 4, 6), (CONV_KERNEL, GDN_V_HEADS, "head_dim"))
    assert shapes["gdn_out"] == ((4, 6, 16), (GDN_V_HEADS, "head_dim", "embed"))
    assert decls["gdn_wq"].decay and not decls["gdn_conv_q"].decay and not decls["gdn_a_log"].decay
    key = jax.random.PRNGKey(0)
    a = np.exp(np.asarray(decls["gdn_a_log"].init(key, (4096,), jnp.float32)))
    assert a.min() >= 0.01 and a.max() <= 16.0
    np.testing.assert_allclose(a.mean(), (0.01 + 16.0) / 2, rtol=0.05)  # U(0.01, 16)
    np.testing.assert_array_equal(np.asarray(decls["gdn_dt_bias"].init(key, (4,))), 1.0)
    np.testing.assert_array_equal(np.asarray(decls["gdn_norm"].init(key, (6,))), 1.0)
    wq = np.asarray(decls["gdn_wq"].init(key, (64, 64)))
    wo = np.asarray(decls["gdn_out"].init(key, (64, 64)))
    np.testing.assert_allclose(wq.std(), 0.02, rtol=0.05)
    np.testing.assert_allclose(wo.std(), 0.02 / 2.0, rtol=0.05)  # / sqrt(2 * n_layers)


def test_bad_inputs_raise():
    p = random_params(CFG, 0)
    h = np.zeros((2, 5, CFG.d_model), np.float32)
    with pytest.raises(ValueError, match=r"h must be \[B, L, D=16\]"):
        gdn_mix(p, h[..., :8], CFG)
    with pytest.raises(ValueError, match="valid_BL must have shape"):
        gdn_mix(p, h, CFG, valid_BL=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="cross_so must be"):
        gdn_mix(p, h, CFG, cross_h_BLD=h, cross_so=(np.ones((4, 8)), np.zeros((4, 8))))
    with pytest.raises(
        ValueError, match=r"GDNState.conv_q has shape \(3, 3, 2, 8\), expected \(2, 3, 2, 8\)"
    ):
        gdn_mix(p, h, CFG, state=init_gdn_state(CFG, 3))
    with pytest.raises(ValueError, match="one token per row"):
        gdn_decode(p, h, CFG, state=init_gdn_state(CFG, 2), active_B=np.ones(2, bool))
    with pytest.raises(ValueError, match="gdn_norm"):
        gdn_mix({**p, "gdn_norm": np.ones(7, np.float32)}, h, CFG)
    hf = gdn_to_hf(p, CFG)
    with pytest.raises(ValueError, match="in_proj_z.weight has shape"):
        hf_to_gdn({**hf, "in_proj_z.weight": hf["in_proj_z.weight"][:-1]}, CFG)
    with pytest.raises(ValueError, match="missing \\['A_log'\\]"):
        hf_to_gdn({k: v for k, v in hf.items() if k != "A_log"}, CFG)


@functools.cache
def _hf_layer():
    """A tiny random Qwen3_5GatedDeltaNet (Hv = 2 Hk, dk != dv) and its config."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    hf_cfg = Qwen3_5TextConfig(
        hidden_size=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=12,
        linear_conv_kernel_dim=4,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        rms_norm_eps=1e-6,
        vocab_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
    )
    torch.manual_seed(0)
    layer = Qwen3_5GatedDeltaNet(hf_cfg, 0).float().eval()
    with torch.no_grad():
        for t in layer.parameters():
            t.normal_(0, 0.3)
        layer.out_proj.weight.normal_(0, 0.05)
        layer.A_log.copy_(torch.empty(4).uniform_(0.01, 4.0).log())
        layer.dt_bias.normal_(0, 1)
        layer.norm.weight.copy_(1 + 0.3 * torch.randn(12))
    cfg = CFG.replace(d_model=32, kinds=dict(gdn=dict(v_head_dim=12, chunk=64)), n_layers=1)
    return torch, layer, cfg


def test_transformers_parity_and_roundtrip():
    torch, layer, cfg = _hf_layer()
    tensors = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    assert sorted(tensors) == sorted(HF_NAMES)
    p = hf_to_gdn(tensors, cfg)
    back = gdn_to_hf(p, cfg)
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype, name
        np.testing.assert_array_equal(back[name], t, err_msg=name)

    x = torch.from_numpy(np.random.default_rng(12).normal(size=(2, 70, 32)).astype(np.float32))
    with torch.no_grad():
        want = layer(x).numpy()  # no cache: transformers' torch chunked rule, chunk 64
    got, _, _ = mix(p, x.numpy(), cfg)
    assert np.abs(want).max() > 1.0
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
