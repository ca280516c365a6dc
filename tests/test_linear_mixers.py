"""The GLA and retention mixers (layers/linear_mixer.py with layers/gla.py, layers/retention.py)
vs fla's layers written from the equations in float64 (oracle_linear.py): GQA, short conv,
clamp, feature maps, no output gate / no norm weight; the Orthros-H cross stream and its read.
Split prefill calls, decode and packed documents through the model: test_kind_conformance.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config
from oracle_linear import gla_mixer, retention_mixer

from orthros_jax.layers import gla, retention
from orthros_jax.layers import linear_mixer as lm
from orthros_jax.layers.recurrent import MixArgs

TOL = {"atol": 1e-5, "rtol": 1e-5}
B, L = 2, 21
CASES = {
    "gla_gqa_conv_clamp": (
        "gla",
        dict(
            kinds=dict(
                gla=dict(
                    heads=4,
                    kv_heads=2,
                    k_head_dim=8,
                    v_head_dim=6,
                    short_conv=True,
                    conv_kernel=3,
                    clamp_min=-0.3,
                    chunk=8,
                )
            )
        ),
    ),
    "gla_relu_plain": (
        "gla",
        dict(
            kinds=dict(
                gla=dict(
                    heads=2,
                    kv_heads=2,
                    k_head_dim=8,
                    v_head_dim=8,
                    feature_map="relu",
                    output_gate=False,
                    norm_affine=False,
                    chunk=16,
                )
            )
        ),
    ),
    "retention_gqa": (
        "retention",
        dict(kinds=dict(retention=dict(heads=4, kv_heads=2, k_head_dim=8, v_head_dim=6, chunk=8))),
    ),
    "retention_swish": (
        "retention",
        dict(
            kinds=dict(
                retention=dict(
                    heads=2, kv_heads=2, k_head_dim=4, v_head_dim=8, feature_map="swish", chunk=4
                )
            )
        ),
    ),
}
MODULE = {"gla": gla, "retention": retention}


def setup(name: str, seed: int = 0):
    kind, fields = CASES[name]
    arch = {"gla": "gla", "retention": "retnet"}[kind]
    cfg = tiny_config(architecture=arch, d_model=16, **fields)
    mod = MODULE[kind]
    rng = np.random.default_rng(seed)
    p = {}
    for n, shape in ((n, d.shape) for n, d in mod.mixer_params(cfg).items()):
        std = 1.0 if n.endswith("norm") or n.endswith("bgk") else 1.0 / np.sqrt(shape[0])
        p[n] = ((1.0 if n.endswith("norm") else 0.0) + std * rng.normal(size=shape)).astype(
            np.float32
        )
    h = rng.normal(size=(B, L, cfg.d_model)).astype(np.float32)
    return cfg, mod, p, h


def run(cfg, mod, p, h, **kw):
    s = mod.spec(cfg)
    state = kw.pop("state", None) or lm.init_state(s, h.shape[0], jnp.float32)
    pos = kw.pop("positions", None)
    pos = jnp.broadcast_to(jnp.arange(h.shape[1]), h.shape[:2]) if pos is None else pos
    fn = functools.partial(lm.mix, spec=s, decay=mod.decay_fn(cfg), decode=kw.pop("decode", False))
    return jax.jit(lambda p, h, st, pos, kw: fn(p, a=MixArgs(h, pos, st, **kw)))(
        p, h, state, pos, kw
    )


def oracle(name, cfg, p, h_LD):
    kind = CASES[name][0]
    if kind == "gla":
        return gla_mixer(
            p,
            h_LD,
            cfg.norm_eps,
            feature_map=cfg.kinds.gla.feature_map,
            clamp_min=cfg.kinds.gla.clamp_min,
        )
    return retention_mixer(p, h_LD, cfg.norm_eps, feature_map=cfg.kinds.retention.feature_map)


@pytest.mark.parametrize("name", sorted(CASES))
def test_mixer_matches_float64_oracle(name):
    cfg, mod, p, h = setup(name)
    y, _, _ = run(cfg, mod, p, h)
    want = np.stack([oracle(name, cfg, p, h[b]) for b in range(B)])
    np.testing.assert_allclose(np.asarray(y), want, **TOL)


@pytest.mark.parametrize("name", ["gla_relu_plain", "retention_gqa"])
def test_cross_stream_and_read(name):
    """Without a conv and with the identity SO, an output copy fed its base token's hidden
    state reproduces the base output; read() at the last token equals the cross output there."""
    cfg, mod, p, h = setup(name, seed=3)
    s = mod.spec(cfg)
    so = (jnp.ones((s.heads, s.k_dim)), jnp.zeros((s.heads, s.k_dim)))
    y, cross_y, state = run(cfg, mod, p, h, cross_h_BLD=h, cross_so=so)
    np.testing.assert_allclose(np.asarray(cross_y), np.asarray(y), **TOL)
    other = np.random.default_rng(9).normal(size=h.shape).astype(np.float32)
    _, cross_y, state = run(cfg, mod, p, h, cross_h_BLD=other)
    pos = jnp.full((B, 1), L - 1)
    got = lm.read(p, other[:, -1:], s, state=state, positions_B1=pos)
    np.testing.assert_allclose(np.asarray(got), np.asarray(cross_y)[:, -1:], **TOL)
