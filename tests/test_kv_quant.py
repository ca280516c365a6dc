"""The quantized KV cache (init_cache(kv_cache_dtype="int8" / "fp8")): per-token, per-kv-head
absmax quantization round-trips within its bound; prefill + decode logits stay within the stated
tolerance of the full-precision cache with the same greedy tokens, for attention and hybrid arms;
the compiled decode step holds no full-precision copy of the cache; the engine and the
sequence-parallel cache serve from it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config
from serving_helpers import arm_model

from orthros_jax import inference
from orthros_jax.inference import drivers
from orthros_jax.inference.cache import kv_cache_dtype
from orthros_jax.kernels import slots as slot_ops
from orthros_jax.model import init_params

# Max |logit error| / max |logit| of a quantized cache against the full-precision one (tiny
# random models, measured: int8 1.1-1.5 %, fp8 e4m3 5-6 %; docs/serving.md).
TOLERANCE = {"int8": 0.03, "fp8": 0.10}


def test_quantize_round_trip_is_within_half_a_step():
    x = (
        jax.random.normal(jax.random.PRNGKey(0), (3, 5, 2, 16))
        * jnp.array([1e-3, 1.0, 50.0])[:, None, None, None]
    )
    x = x.at[0, 0, 0].set(0.0)  # an all-zero vector: scale 1, values 0
    for name, qmax in slot_ops.QUANT_MAX.items():
        q, scale = slot_ops.quantize(x, name, jnp.float32)
        back = np.asarray(slot_ops.dequantize(q, scale))
        step = np.asarray(jnp.max(jnp.abs(x), -1) / qmax)[..., None]
        # int8: half a step; fp8: its relative precision (3 / 2 mantissa bits) of the value.
        bound = (
            0.5 * step
            if name == "int8"
            else np.abs(np.asarray(x)) * (2**-3 if "e4m3" in name else 2**-2) + 1e-12
        )
        assert (np.abs(back - np.asarray(x)) <= bound + 1e-7).all(), name
        assert q.dtype == jnp.dtype(name) and scale.shape == x.shape[:-1]
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        inference.init_cache(tiny_config(), 1, 8, kv_cache_dtype="int4")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["orthros", "transformer", "hybrid"])
def test_quantized_cache_logits_within_tolerance_of_full_precision(arch):
    cfg, params = arm_model(arch)
    rng = np.random.default_rng(0)
    toks, lens = rng.integers(0, 256, (2, 20)), np.array([20, 13])
    feed = rng.integers(0, 256, (6, 2))
    got = {}
    for kv in (None, "int8", "fp8"):
        cache = inference.init_cache(cfg, 2, 48, kv_cache_dtype=kv)
        assert kv_cache_dtype(cache) == (
            None if kv is None else {"int8": "int8", "fp8": "float8_e4m3fn"}[kv]
        )
        logits, cache = inference.prefill(params, cache, toks, lens, cfg)
        steps = [logits]
        for t in feed:
            logits, cache = inference.decode_step(params, cache, jnp.asarray(t), cfg)
            steps.append(logits)
        got[kv] = np.stack([np.asarray(s) for s in steps])
    full = got[None]
    for kv, tol in TOLERANCE.items():
        err = np.abs(got[kv] - full).max() / np.abs(full).max()
        assert err <= tol, (kv, err)
        assert err > 0  # it is quantized
    # Greedy agrees wherever the full-precision top-2 gap exceeds twice the error (the rest are
    # near-ties a 1 % perturbation may flip), and on most steps.
    top2 = np.sort(full, -1)[..., -2:]
    err = np.abs(got["int8"] - full).max(-1)
    clear = top2[..., 1] - top2[..., 0] > 2 * err
    agree = got["int8"].argmax(-1) == full.argmax(-1)
    assert agree[clear].all() and clear.mean() > 0.5, (agree, clear)


@pytest.mark.optimized  # about the compiled program
def test_compiled_decode_holds_no_full_precision_copy_of_the_cache():
    cfg = tiny_config(architecture="orthros", n_layers=4, window=4)
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    tok, act = jax.ShapeDtypeStruct((2,), jnp.int32), jax.ShapeDtypeStruct((2,), bool)

    def stats(kv):
        cache = jax.eval_shape(lambda: inference.init_cache(cfg, 2, 2048, kv_cache_dtype=kv))
        compiled = drivers.decode_jit.lower(params, cache, tok, act, cfg=cfg).compile()
        size = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(cache))
        return size, compiled.memory_analysis().temp_size_in_bytes

    full_bytes, full_temp = stats(None)
    q_bytes, q_temp = stats("int8")
    # int8 values + one float32 scale per head_dim of them, against float32 (lengths aside)
    want = (full_bytes - 8) * (1 + 4 / cfg.head_dim) / 4 + 8
    np.testing.assert_allclose(q_bytes, want, rtol=1e-6)
    # A layer's dequantized slice at most (XLA:CPU materializes it before the dot): well below
    # the full-precision cache (4 layers), so no dequantized copy of the whole cache exists.
    assert q_temp < 0.5 * full_bytes, (q_temp, full_bytes, full_temp)


@pytest.mark.slow
def test_engine_and_generate_serve_from_an_int8_cache():
    from orthros_jax.serving.engine import Engine
    from orthros_jax.serving.requests import SamplingParams

    cfg, params = arm_model("orthros")
    prompts = [[5, 9, 200, 31, 7, 7, 1], [3, 4]]
    want = inference.generate(params, prompts, cfg, max_new_tokens=5, kv_cache_dtype="int8")
    engine = Engine(params, cfg, max_batch=2, max_len=40, chunk_budget=8, kv_cache_dtype="int8")
    got: list[list[int]] = [[], []]
    for i, p in enumerate(prompts):
        engine.submit(
            p,
            SamplingParams(max_tokens=5, temperature=0.0),
            lambda ev, i=i: ev.token is not None and got[i].append(ev.token),
        )
    while engine.busy():
        engine.step()
    assert got == np.asarray(want.tokens)[:, :5].tolist()
    assert kv_cache_dtype(engine.cache) == "int8"
