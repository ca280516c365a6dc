"""The GDN-bearing arms (gdn, hybrid, orthros_h) against the float64 oracle (oracle.py +
oracle_gdn.py): packed PT, SFT at unsorted output positions, chunked prefill with a prefill
chunk (3) that is not a multiple of the GDN chunk (4) and ragged prompts, decode after it; at
2e-5 with random norms, SO, conv taps and decays. Then the Orthros-H cross-query choices are
shown to matter: the oracle without the cross SiLU moves the logits far beyond the tolerance."""

from __future__ import annotations

import functools

import jax
import numpy as np
import oracle
import oracle_gdn
import pytest
from test_oracle import (
    DOCS,
    OUTPUT_INDEX,
    T,
    _packing,
    _tokens,
    check_prefill_decode,
)

from orthros_jax.config import ModelConfig
from orthros_jax.model import OrthrosLM, init_params

ATOL = 2e-5
ARCHS = ("gdn", "hybrid", "orthros_h")


def _cfg(arch: str) -> ModelConfig:
    layers = ("gdn",) if arch == "gdn" else ("gdn", "attention")
    return ModelConfig(
        vocab_size=53, d_model=32, n_layers=4 if arch != "gdn" else 2, n_heads=4, n_kv_heads=2,
        head_dim=8, d_ff=64, window=5, architecture=arch, layer_types=layers, prefill_chunk=3,
        attention_block_q=8, attention_block_k=8, attention_block_local=4, gdn_num_k_heads=2,
        gdn_num_v_heads=4, gdn_k_head_dim=8, gdn_v_head_dim=6, gdn_conv_kernel=3, gdn_chunk=4,
    )  # fmt: skip


def _draw(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values far from the init, so every parameter matters (stacked [layers, ...])."""
    if name.endswith("norm") or name.endswith("_scale"):
        return rng.uniform(0.5, 1.5, shape)
    if name.endswith("_offset"):
        return 0.5 * rng.standard_normal(shape)
    if name == "embedding":
        return 0.3 * rng.standard_normal(shape)
    if name == "gdn_a_log":  # decays e^g between ~0.2 and ~0.99 per token
        return np.log(rng.uniform(0.05, 1.0, shape))
    if name == "gdn_dt_bias":
        return rng.standard_normal(shape)
    if name.startswith("gdn_conv_"):
        return rng.standard_normal(shape) / np.sqrt(shape[1])
    if name in ("wq", "wk", "wv") or name.startswith("gdn_w"):
        fan_in = shape[1]  # [layers, D, ...]
    elif name in ("wo", "gdn_out"):
        fan_in = shape[1] * shape[2]
    else:
        fan_in = shape[-2]
    return rng.standard_normal(shape) / np.sqrt(fan_in)


@functools.cache
def _setup(arch: str):
    cfg = _cfg(arch)
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    rng = np.random.default_rng(ARCHS.index(arch) + 40)

    def fill(tree):
        return {
            name: fill(sub) if isinstance(sub, dict) else _draw(name, sub.shape, rng)
            for name, sub in tree.items()
        }

    params32 = jax.tree.map(lambda a: np.asarray(a, np.float32), fill(shapes))
    forward = jax.jit(
        lambda p, t, pos, seg, idx: OrthrosLM(cfg).apply(
            {"params": p}, t, positions=pos, segment_ids=seg, output_positions=idx
        )
    )
    return cfg, params32, oracle.to_float64(params32), oracle.Spec.from_config(cfg), forward


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_oracle(arch):
    cfg, p32, p64, spec, forward = _setup(arch)
    tokens = _tokens(cfg, (2, T), seed=1)
    pos, seg = _packing()
    # SFT at unsorted output positions (first tokens of documents included), packed rows.
    want = oracle.forward_batch(
        p64, spec, tokens, positions=pos, segments=seg, output_index=OUTPUT_INDEX
    )
    got = np.asarray(forward(p32, tokens, pos, seg, OUTPUT_INDEX))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    # PT at every position: row 0 one document, row 1 packed.
    pos, seg = _packing(([T], DOCS[1]))
    every = np.broadcast_to(np.arange(T), (2, T))
    want = oracle.forward_batch(p64, spec, tokens, positions=pos, segments=seg)
    np.testing.assert_allclose(
        np.asarray(forward(p32, tokens, pos, seg, every)), want, atol=ATOL, rtol=0
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_and_decode_match_oracle(arch):
    cfg, p32, p64, spec, _ = _setup(arch)
    check_prefill_decode(cfg, p32, p64, spec)


def test_cross_query_choices_move_the_oracle_beyond_the_tolerance():
    """The model matches the oracle with SiLU on the cross query (above); dropping it, or the
    cross SO, changes the logits by far more than ATOL, so the comparison pins the choice."""
    cfg, _, p64, spec, _ = _setup("orthros_h")
    tokens = _tokens(cfg, (T,), seed=4)
    want = oracle.forward(p64, spec, tokens)
    no_silu = dict(oracle.KINDS)
    no_silu["gdn"] = oracle.Kind(
        lambda p, s, b, o: oracle_gdn.gdn_layer(p, s, b, o, cross_silu=False),
        "gdn_layers",
        oracle_gdn.gdn_param_names,
    )
    gap = np.abs(oracle.forward(p64, spec, tokens, kinds=no_silu) - want).max()
    assert gap > 100 * ATOL, gap
    identity = {**p64, "gdn_layers": dict(p64["gdn_layers"])}
    identity["gdn_layers"]["gdn_so_out_scale"] = np.ones_like(p64["gdn_layers"]["gdn_so_out_scale"])
    identity["gdn_layers"]["gdn_so_out_offset"] = np.zeros_like(
        p64["gdn_layers"]["gdn_so_out_offset"]
    )
    gap = np.abs(oracle.forward(identity, spec, tokens) - want).max()
    assert gap > 100 * ATOL, gap
