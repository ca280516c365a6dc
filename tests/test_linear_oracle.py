"""The GLA / retention arms (gla, retnet, orthros_h with either) against the float64 oracle
(oracle.py + oracle_linear.linear_layer, from fla's equations): packed PT and SFT at unsorted
output positions, with random norms, SO, conv taps, clamp and feature maps; then one choice of
the cross query is shown to matter."""

from __future__ import annotations

import functools

import numpy as np
import oracle
import pytest
from oracle_linear import linear_layer
from test_oracle import DOCS, OUTPUT_INDEX, T, _packing, _tokens, random_params, sft_forward
from test_oracle import _draw as oracle_draw

from orthros_jax.config import ModelConfig
from orthros_jax.layers.registry import KINDS

ATOL = 2e-5
CASES = {
    "gla": dict(
        architecture="gla",
        layer_types=("gla",),
        kinds=dict(gla=dict(short_conv=True, conv_kernel=3, clamp_min=-0.5, feature_map="relu")),
    ),
    "retnet": dict(
        architecture="retnet",
        layer_types=("retention",),
        kinds=dict(retention=dict(feature_map="sigmoid")),
    ),
    "orthros_h_gla": dict(
        architecture="orthros_h",
        layer_types=("gla", "attention"),
        kinds=dict(gla=dict(short_conv=True, conv_kernel=3)),
    ),
    "orthros_h_ret": dict(architecture="orthros_h", layer_types=("retention", "attention")),
}


def _cfg(name: str) -> ModelConfig:
    return ModelConfig(
        vocab_size=53,
        d_model=32,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=64,
        window=5,
        prefill_chunk=3,
        attention_block_q=8,
        attention_block_k=8,
        attention_block_local=4,
        kinds=dict(
            gla=dict(heads=4, kv_heads=2, k_head_dim=8, v_head_dim=6, chunk=4),
            retention=dict(heads=4, kv_heads=2, k_head_dim=8, v_head_dim=6, chunk=4),
        ),
    ).replace(scale_offset=None, **CASES[name])  # None: the arm's default


def _draw(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """test_oracle's draw, plus the mixers' parameters ([layers, ...]): fan-in scaled
    projections (the gate's bias around -1: decays of ~0.98 per token and key dim)."""
    if name == "gla_bgk":
        return rng.standard_normal(shape) - 1.0
    if name.endswith(("_wq", "_wk", "_wv", "_wg", "_wgk1", "_wgk2")) or "_conv_" in name:
        return rng.standard_normal(shape) / np.sqrt(shape[1])
    if name in ("gla_out", "retention_out"):
        return rng.standard_normal(shape) / np.sqrt(shape[1] * shape[2])
    return oracle_draw(name, shape, rng)


def _kinds(cfg: ModelConfig) -> dict[str, oracle.Kind]:
    """oracle.KINDS plus the linear kinds with cfg's options; the names they read are the ones
    our kinds declare (the oracle checks the tree holds exactly those)."""
    options = {
        "gla": dict(
            feature_map=cfg.kinds.gla.feature_map,
            normalizer=cfg.kinds.gla.gate_normalizer,
            clamp_min=cfg.kinds.gla.clamp_min,
        ),
        "retention": dict(feature_map=cfg.kinds.retention.feature_map),
    }
    out = dict(oracle.KINDS)
    for kind in ("gla", "retention"):
        names = set(KINDS[kind].params(cfg))
        layer = functools.partial(linear_layer, kind, **options[kind])
        out[kind] = oracle.Kind(layer, f"{kind}_layers", lambda spec, names=names: names)
    return out


@functools.cache
def _setup(name: str):
    cfg = _cfg(name)
    params32, params64 = random_params(cfg, sorted(CASES).index(name) + 70, _draw)
    return cfg, params32, params64, oracle.Spec.from_config(cfg), sft_forward(cfg)


# The fast tier: each kind alone (its cross query is the slow orthros_h cases').
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.slow] if "orthros" in n else []) for n in sorted(CASES)],
)
def test_forward_matches_oracle(name):
    cfg, p32, p64, spec, forward = _setup(name)
    kinds = _kinds(cfg)
    tokens = _tokens(cfg, (2, T), seed=1)
    pos, seg = _packing()
    want = oracle.forward_batch(
        p64, spec, tokens, positions=pos, segments=seg, output_index=OUTPUT_INDEX, kinds=kinds
    )
    got = np.asarray(forward(p32, tokens, pos, seg, OUTPUT_INDEX))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    pos, seg = _packing(([T], DOCS[1]))
    every = np.broadcast_to(np.arange(T), (2, T))
    want = oracle.forward_batch(p64, spec, tokens, positions=pos, segments=seg, kinds=kinds)
    np.testing.assert_allclose(
        np.asarray(forward(p32, tokens, pos, seg, every)), want, atol=ATOL, rtol=0
    )


def test_cross_query_choice_moves_the_oracle_beyond_the_tolerance():
    """The identity cross SO instead of the drawn one changes the logits by far more than
    ATOL: the comparison above pins the output copies' own query."""
    cfg, _, p64, spec, _ = _setup("orthros_h_gla")
    kinds, tokens = _kinds(cfg), _tokens(cfg, (T,), seed=4)
    want = oracle.forward(p64, spec, tokens, kinds=kinds)
    identity = {**p64, "gla_layers": dict(p64["gla_layers"])}
    for part, fill in (("scale", np.ones_like), ("offset", np.zeros_like)):
        name = f"gla_so_out_{part}"
        identity["gla_layers"][name] = fill(p64["gla_layers"][name])
    gap = np.abs(oracle.forward(identity, spec, tokens, kinds=kinds) - want).max()
    assert gap > 100 * ATOL, gap
