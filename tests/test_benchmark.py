"""The benchmark's references compute what they claim, its flop model and its report (it runs end
to end, every suite, in tests/test_device_check.py's dry run)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

from benchmarks import common as bench
from benchmarks import report as bench_report
from orthros_jax.inference import init_cache, prefill
from orthros_jax.layers import flops
from orthros_jax.layers.attention import keys_read
from orthros_jax.model import init_params

CFG = tiny_config(vocab_size=64, n_layers=3, window=4, architecture="transformer", prefill_chunk=8)


@pytest.mark.slow
def test_dense_prefill_equals_transformer_prefill():
    params = init_params(CFG, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 24), 0, 64)
    lengths = jnp.full((2,), 24, jnp.int32)
    want, cache_a = prefill(params, init_cache(CFG, 2, 24), tokens, lengths, CFG)
    got, cache_b = bench.dense_prefill(CFG)(params, init_cache(CFG, 2, 24), tokens)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)
    np.testing.assert_allclose(
        np.asarray(cache_b.states["attention"][0]),
        np.asarray(cache_a.states["attention"][0]),
        atol=1e-5,
        rtol=0,
    )
    floor_logits, floor_cache = bench.floor_prefill(CFG)(params, init_cache(CFG, 2, 24), tokens)
    assert floor_logits.shape == want.shape
    # The floor writes the cache of the first layer exactly (attention only changes later ones).
    np.testing.assert_allclose(
        np.asarray(floor_cache.states["attention"][0][0]),
        np.asarray(cache_a.states["attention"][0][0]),
        atol=1e-5,
        rtol=0,
    )


def test_time_interleaved_alternates_calls_and_ratio_is_per_round():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b")}
    timing = bench.time_interleaved(calls, repeats=3)
    assert order == ["a", "b"] * 4  # one warm-up each, then 3 rounds of both
    assert timing["a"]["repeats"] == 3 and len(timing["b"]["times_s"]) == 3
    a = {"times_s": [1.0, 4.0, 2.0]}
    b = {"times_s": [2.0, 1.0, 1.0]}  # per-round ratios 0.5, 4, 2
    assert bench.ratio(a, b) == 2.0


def test_flop_model_hand_values():
    cfg = CFG.replace(architecture="orthros", scale_offset=True)
    # Window keys: positions 0..5 with w=4 read 1+2+3+4+4+4 keys.
    assert keys_read(0, 6, 4) == 18
    assert keys_read(0, 6, None) == 21
    assert keys_read(4, 2, 4) == 8  # positions 4, 5 only
    # Orthros prefill grows linearly, the Transformer's quadratically.
    o1, o2 = flops.prefill_flops(cfg, 1000), flops.prefill_flops(cfg, 2000)
    t1, t2 = flops.prefill_flops(CFG, 1000), flops.prefill_flops(CFG, 2000)
    assert o2 / o1 < 2.01 and t2 / t1 > 2.5
    assert flops.floor_prefill_flops(cfg, 1000) < o1


# launch/benchmark.py end to end, every suite: tests/test_device_check.py (the dry run).


def test_headline_reads_each_target_from_its_suite():
    def timed(s: float) -> dict:
        return {"median_s": s}

    results = {
        "prefill": [
            {"T": 8192, "orthros": timed(1.0), "orthros_over_floor": 1.5},  # not a target length
            {
                "T": 16384,
                "orthros": timed(2.0),
                "orthros_over_floor": 1.1,
                "speedup_fraction_of_ideal": 1.3,
            },
            {"T": 32768, "orthros": timed(4.2), "orthros_over_floor": 1.15},
        ],
        "honesty": [{"T": 1024, "ours_over_dense": 0.7}, {"T": 8192, "ours_over_dense": 0.8}],
        "decode": [
            {"context": 8192, "orthros_over_transformer": 1.3},
            {"context": 16384, "orthros_over_transformer": 1.09},
        ],
        "memory": [{"T": 32768, "orthros": {"temp_over_resident": 0.24}}],
        "train": {"time_ratio_over_flop_ratio": 0.79},
    }
    got = bench_report.headline(results)
    want = {
        "speedup_fraction_of_ideal": 1.3,
        "ours_over_dense": 0.8,
        "orthros_over_floor": 1.15,
        "scaling_32k_16k": 2.1,
        "decode_ratio": 1.09,
        "temp_memory": 0.24,
        "train_ratio": 0.79,
    }
    assert list(got) == list(bench_report.TARGETS)
    np.testing.assert_allclose([got[k] for k in want], [want[k] for k in want], rtol=1e-12)
    # A run without the long lengths or suites leaves those figures empty.
    short = bench_report.headline({"prefill": results["prefill"][:1]})
    assert all(value is None for value in short.values())


def test_report_of_a_run_without_core_suites_is_bench_json_only(tmp_path):
    """A table4- or sequence-only run: bench.json holds its numbers, with no headline of
    unmeasured figures, and no bench.md / bench.png."""
    results = {"date": "d", "backend": "cpu", "table4": {"prefill": [], "decode": []}}
    assert bench_report.write_report(results, str(tmp_path)) == ["bench.json"]
    assert sorted(os.listdir(tmp_path)) == ["bench.json"]
    assert json.loads((tmp_path / "bench.json").read_text()) == results


def test_report_names_the_measured_train_length_and_skips_an_empty_plot(tmp_path):
    """--config.train_len=256 is reported at 256 (not the default 2048); a memory-only run
    writes bench.md but no bench.png (it has no prefill times to plot)."""
    results = {
        "date": "d",
        "backend": "cpu",
        "device": "cpu",
        "cpu_count": 2,
        "jax": "x",
        "command": "c",
        "wall_s": 1.0,
        "xla_flags": "",
        "repeats": 1,
        "memory": [{"T": 1024, "orthros": {"temp_over_resident": 0.1}}],
        "train": {"T": 256, "time_ratio_over_flop_ratio": 0.9},
    }
    assert bench_report.write_report(results, str(tmp_path)) == ["bench.json", "bench.md"]
    text = (tmp_path / "bench.md").read_text()
    assert "PT step Orthros / Transformer at 256," in text and "at 2048" not in text
    assert not (tmp_path / "bench.png").exists()
