"""The model against the independent float64 oracle (tests/oracle.py) of the paper's equations.

Every mode the library serves (PT, packed PT, SFT at unsorted output positions, chunked prefill
with chunk < window and ragged prompts, decode after it) is compared at 2e-5 (fp32 model,
float64 oracle) for the three arms, with random non-identity norm scales and SO vectors, GQA
(4 query / 2 kv heads), and q/k norm with the tied head or neither with the untied head. Then
the comparison is shown to have teeth: the two classic mistakes (SO after RoPE; the output
stream fed from the base hidden state) move the oracle's logits by far more than the tolerance.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import oracle
import pytest

from orthros_jax import inference as inf
from orthros_jax.config import ModelConfig
from orthros_jax.model import OrthrosLM, init_params

ATOL = 2e-5
WINDOW, CHUNK = 5, 3  # chunk < window: a chunk's window reaches back over two earlier chunks
LENGTHS = np.array([2, 7, 13, 20])  # ragged: < chunk, < window, several chunks, 7 chunks
N_DECODE = 4
T = 24
ARCHS = ("orthros", "transformer", "swa")
VARIANTS = {"plain": {}, "qknorm_tied": {"qk_norm": True, "tie_embeddings": True}}
# Each arm with both variants would double the compiles (~10 s of one core per config): Orthros
# gets both, the single-stream arms one each; the head and the norms are shared by every arm.
CASES = [("orthros", "plain"), ("orthros", "qknorm_tied"), ("transformer", "qknorm_tied")]
CASES += [("swa", "plain")]
# The fast tier (-m "not slow") runs Orthros with its window, SO and two streams; the rest slow.
TIERED = [
    pytest.param(*c, marks=[] if c == ("orthros", "plain") else [pytest.mark.slow]) for c in CASES
]
# Packed documents: segment lengths per row (positions restart at 0 in each document).
DOCS = ([9, 15], [4, 11, 9])
# Unsorted array indices into T, first tokens of documents included (row 0: index 9; row 1: 0, 4).
OUTPUT_INDEX = np.array([[5, 1, 7, 3, 20, 9], [22, 0, 14, 4, 16, 9]])


def _cfg(arch: str, variant: str) -> ModelConfig:
    return ModelConfig(
        vocab_size=53,
        d_model=32,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=64,
        window=WINDOW,
        architecture=arch,
        scale_offset=arch == "orthros",
        prefill_chunk=CHUNK,
        attention_block_q=8,
        attention_block_k=8,
        attention_block_local=4,
        **VARIANTS[variant],
    )


def _draw(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values far from the identity init, so every parameter matters to the logits."""
    if name.endswith("norm") or name.endswith("_scale"):
        return rng.uniform(0.5, 1.5, shape)
    if name.endswith("_offset"):
        return 0.5 * rng.standard_normal(shape)
    if name == "embedding":  # 0.3: keeps the tied head's logits O(1), like the untied ones
        return 0.3 * rng.standard_normal(shape)
    # Stacked [layers, in..., out...]: wq/wk/wv read D, wo reads N * H, the rest their [-2] axis.
    if name in ("wq", "wk", "wv"):
        fan_in = shape[1]
    elif name == "wo":
        fan_in = shape[1] * shape[2]
    else:
        fan_in = shape[-2]
    return rng.standard_normal(shape) / np.sqrt(fan_in)


def random_params(cfg: ModelConfig, seed: int, draw=_draw) -> tuple[dict, dict]:
    """(fp32 params for the model, the same in float64 for the oracle), every leaf from
    `draw(name, shape, rng)`."""
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    rng = np.random.default_rng(seed)

    def fill(tree):
        return {
            name: fill(sub) if isinstance(sub, dict) else draw(name, sub.shape, rng)
            for name, sub in tree.items()
        }

    params32 = jax.tree.map(lambda a: np.asarray(a, np.float32), fill(shapes))
    return params32, oracle.to_float64(params32)


def sft_forward(cfg: ModelConfig):
    """The jitted model forward with output copies at `idx`: (params, tokens, positions,
    segment ids, idx) -> logits."""
    return jax.jit(
        lambda p, t, pos, seg, idx: OrthrosLM(cfg).apply(
            {"params": p}, t, positions=pos, segment_ids=seg, output_positions=idx
        )
    )


@functools.cache
def _setup(arch: str, variant: str):
    """(cfg, fp32 params for the model, float64 params for the oracle, spec, jitted forward)."""
    cfg = _cfg(arch, variant)
    params32, params64 = random_params(cfg, sorted(ARCHS).index(arch) * 10 + len(variant))
    forward = sft_forward(cfg)
    pt_forward = jax.jit(
        lambda p, t, pos, seg: OrthrosLM(cfg).apply(
            {"params": p}, t, positions=pos, segment_ids=seg
        )
    )
    spec = oracle.Spec.from_config(cfg)
    return cfg, params32, params64, spec, forward, pt_forward


def _tokens(cfg: ModelConfig, shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, shape)


def _packing(docs_per_row: tuple[list[int], ...] = DOCS) -> tuple[np.ndarray, np.ndarray]:
    """positions, segment ids [rows, T] of rows packed with documents of the given lengths."""
    pos = [np.concatenate([np.arange(n) for n in docs]) for docs in docs_per_row]
    seg = [np.repeat(np.arange(1, len(docs) + 1), docs) for docs in docs_per_row]
    return np.stack(pos), np.stack(seg)


@pytest.mark.parametrize(("arch", "variant"), TIERED)
def test_forward_matches_oracle(arch, variant):
    cfg, p32, p64, spec, forward, pt_forward = _setup(arch, variant)
    tokens = _tokens(cfg, (2, T), seed=1)
    # PT, logits at every position: row 0 one document (positions 0..T-1), row 1 packed.
    pos, seg = _packing(([T], DOCS[1]))
    want = oracle.forward_batch(p64, spec, tokens, positions=pos, segments=seg)
    got = np.asarray(pt_forward(p32, tokens, pos, seg))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    # SFT at unsorted output positions, both rows packed.
    pos, seg = _packing()
    want = oracle.forward_batch(
        p64, spec, tokens, positions=pos, segments=seg, output_index=OUTPUT_INDEX
    )
    got = np.asarray(forward(p32, tokens, pos, seg, OUTPUT_INDEX))
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def check_prefill_decode(cfg, p32, p64, spec) -> None:
    """Chunked prefill of ragged prompts, then N_DECODE steps, against the oracle's logits."""
    bsz, rows = len(LENGTHS), np.arange(len(LENGTHS))
    full = _tokens(cfg, (bsz, T), seed=2)
    # Right padding with other valid tokens: the model must never read it.
    junk = _tokens(cfg, (bsz, T), seed=3)
    prompts = np.where(np.arange(T)[None] < LENGTHS[:, None], full, junk)
    cache = inf.init_cache(cfg, bsz, T)
    logits, cache = inf.prefill(p32, cache, prompts, LENGTHS, cfg)
    want = oracle.next_token_logits(p64, spec, full, LENGTHS)
    np.testing.assert_allclose(np.asarray(logits), want, atol=ATOL, rtol=0)
    for i in range(N_DECODE):
        logits, cache = inf.decode_step(p32, cache, full[rows, LENGTHS + i], cfg)
        want = oracle.next_token_logits(p64, spec, full, LENGTHS + i + 1)
        np.testing.assert_allclose(np.asarray(logits), want, atol=ATOL, rtol=0, err_msg=f"step {i}")


@pytest.mark.parametrize(("arch", "variant"), TIERED)
def test_chunked_prefill_and_decode_match_oracle(arch, variant):
    cfg, p32, p64, spec, _, _ = _setup(arch, variant)
    check_prefill_decode(cfg, p32, p64, spec)


# ---------------------------------------------------------------- the comparison has teeth


def _so_after_rope(p, stream: oracle.Stream, spec: oracle.Spec, name: str) -> np.ndarray:
    """Mistake 1: the query scale-offset applied after RoPE instead of before."""
    h = oracle.rms_norm(stream.x, p["attn_norm"], spec.norm_eps)
    q = np.einsum("ld,dnh->lnh", h, p["wq"])
    if spec.qk_norm:
        q = oracle.rms_norm(q, p["q_norm"], spec.norm_eps)
    q = oracle.rope(q, stream.positions, spec.rope_theta)
    return p[f"so_{name}_scale"] * q + p[f"so_{name}_offset"]


def _out_fed_from_base(p, spec: oracle.Spec, base: oracle.Stream, out: oracle.Stream):
    """Mistake 2: each layer's output stream reads the base hidden state of its token instead
    of carrying its own residual path from the token embedding."""
    source = [
        np.flatnonzero((base.positions == pos) & (base.segments == seg))[0]
        for pos, seg in zip(out.positions, out.segments, strict=True)
    ]
    return oracle.attention_layer(p, spec, base, dataclasses.replace(out, x=base.x[source]))


@pytest.mark.parametrize("variant", VARIANTS)
def test_classic_mistakes_move_the_oracle_far_beyond_the_tolerance(variant):
    cfg, p32, p64, spec, forward, _ = _setup("orthros", variant)
    tokens = _tokens(cfg, (2, T), seed=1)
    pos, seg = _packing()
    args = dict(positions=pos, segments=seg, output_index=OUTPUT_INDEX)
    right = oracle.forward_batch(p64, spec, tokens, **args)
    np.testing.assert_allclose(
        np.asarray(forward(p32, tokens, pos, seg, OUTPUT_INDEX)), right, atol=ATOL, rtol=0
    )
    attention = oracle.KINDS["attention"]
    mistakes = {
        "SO after RoPE": functools.partial(oracle.attention_layer, query_fn=_so_after_rope),
        "output stream fed from base": _out_fed_from_base,
    }
    for what, layer in mistakes.items():
        kinds = {"attention": dataclasses.replace(attention, layer=layer)}
        wrong = oracle.forward_batch(p64, spec, tokens, kinds=kinds, **args)
        gap = np.abs(wrong - right).max()
        assert gap > 100 * ATOL, f"{what}: max |wrong - right| = {gap:.2e}, no teeth"


# ---------------------------------------------------------------- the oracle on its own


def test_oracle_orthros_with_identity_so_and_full_window_is_the_transformer():
    # PAPER.md: with w >= T and identity SO, Orthros computes exactly the Transformer.
    _, _, p64, spec, _, _ = _setup("orthros", "qknorm_tied")
    tokens = _tokens(_cfg("orthros", "qknorm_tied"), (1, 12), seed=4)
    layers = dict(p64["layers"])
    for name in list(layers):
        if name.startswith("so_"):
            layers[name] = np.full_like(layers[name], float(name.endswith("_scale")))
    identity = {**p64, "layers": layers}
    wide = dataclasses.replace(spec, window=12)
    transformer = dataclasses.replace(wide, architecture="transformer", scale_offset=False)
    plain = {**identity, "layers": {n: a for n, a in layers.items() if not n.startswith("so_")}}
    want = oracle.forward_batch(plain, transformer, tokens)
    np.testing.assert_allclose(oracle.forward_batch(identity, wide, tokens), want, atol=1e-12)
    # ... and neither the window (< T) nor the random SO is a no-op.
    for p, s in ((identity, spec), (p64, wide)):
        assert np.abs(oracle.forward_batch(p, s, tokens) - want).max() > 100 * ATOL


def test_oracle_rope_depends_on_relative_position_only():
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((2, 1, 1, 8))

    def score(a: int, b: int) -> float:
        return float(
            np.sum(oracle.rope(q, np.array([a]), 1e4) * oracle.rope(k, np.array([b]), 1e4))
        )

    np.testing.assert_allclose(score(7, 3), score(20, 16), rtol=1e-12)
    assert abs(score(7, 3) - score(7, 6)) > 1e-3


def test_oracle_rejects_a_tree_that_does_not_fit_the_spec():
    _, _, p64, spec, _, _ = _setup("orthros", "plain")
    tokens = np.arange(4)
    with pytest.raises(ValueError, match="attention layer params"):
        oracle.forward(p64, dataclasses.replace(spec, qk_norm=True), tokens)
    with pytest.raises(ValueError, match="top-level params"):
        oracle.forward(p64, dataclasses.replace(spec, tie_embeddings=True), tokens)
    with pytest.raises(ValueError, match="depth"):
        oracle.forward(p64, dataclasses.replace(spec, layer_kinds=("attention",) * 2), tokens)
    with pytest.raises(ValueError, match="kinds \\['mamba'\\] unknown"):
        oracle.forward(p64, dataclasses.replace(spec, layer_kinds=("mamba",) * 3), tokens)
