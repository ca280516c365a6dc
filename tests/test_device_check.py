"""benchmarks/device_check.sh --dry-run on CPU at tiny sizes: every step runs and writes its
files under the one output folder; the summary is built from the benchmark's own numbers. Its
launch/benchmark.py run is also launch/benchmark.py's end-to-end test: the flags after
--dry-run add every other suite (honesty, memory, inference, window, table4) to the dry run's
prefill, decode, train and speculative, so one process compiles the bench model once for all of
them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.device_report import summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The other suites' sizes (the dry run's model: d 64, 2 layers, window 16, prefill chunk 64).
OTHER_SUITES = [
    "--suites=prefill,decode,train,speculative,honesty,memory,inference,window,table4",
    "--config.window_blocks=(4,8)",
    "--config.inference_len=24",
    "--config.inference_new_tokens=2",
    "--config.gdn.num_k_heads=2",
    "--config.gdn.num_v_heads=4",
    "--config.gdn.k_head_dim=8",
    "--config.gdn.v_head_dim=8",
    "--config.gdn.chunk=8",
    "--config.gla.k_head_dim=8",
    "--config.gla.v_head_dim=8",
    "--config.ret.k_head_dim=8",
    "--config.ret.v_head_dim=8",
    "--config.table4_n_layers=4",  # one (gdn, gdn, gdn, attention) cycle
    "--config.table4_lengths=(40,)",
    "--config.table4_contexts=(32,)",
]


@pytest.mark.slow
def test_dry_run_writes_every_output_and_every_suite_runs(tmp_path):
    """A named end-to-end scenario: the device check's dry run, whose benchmark runs every
    suite of launch/benchmark.py (one process, about 25 compiles)."""
    out = tmp_path / "check"
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run(
        ["bash", "benchmarks/device_check.sh", str(out), "--dry-run", *OTHER_SUITES],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=900,
    )
    for name in ("tests.log", "tests.xml", "bench.log", "bench/bench.json", "summary.md"):
        assert (out / name).is_file(), name
    assert "3 passed" in (out / "tests.log").read_text()  # the cuDNN refusals ran
    bench = json.loads((out / "bench" / "bench.json").read_text())
    assert [r["T"] for r in bench["prefill"]] == [128, 256]
    assert (out / "summary.md").read_text() == summary(bench)
    # The prefill, decode and train suites end to end, and the report of their numbers.
    for row in bench["prefill"]:
        assert all(row[arm]["median_s"] > 0 for arm in ("orthros", "transformer", "floor"))
    assert [r["context"] for r in bench["decode"]] == [128]
    assert bench["decode"][0]["orthros_over_transformer"] > 0
    assert bench["train"]["T"] == 64 and bench["train"]["time_ratio_over_flop_ratio"] > 0
    assert (out / "bench" / "bench.png").stat().st_size > 1000
    md = (out / "bench" / "bench.md").read_text()
    assert "| T |" in md and "| orthros | " in md
    # The speculative decode (k = 2, 3 new tokens: the first, then rounds of at most 1 draft;
    # Orthros only: the Transformer's rounds are tests/test_speculative.py's).
    (spec,) = bench["speculative"]
    assert (spec["context"], spec["k"], spec["new_tokens"]) == (128, 2, 3)
    assert "transformer" not in spec  # the dry run times Orthros only (spec_arms)
    a = spec["orthros"]
    assert a["plain_tok_s"] > 0 and a["spec_tok_s"] > 0 and a["round_over_step"] > 0
    assert a["tokens_per_verify"] >= 1
    assert a["projected_ratio"] == pytest.approx(2.79 / a["round_over_step"], rel=1e-12)
    assert "| 128 | orthros | 2 |" in (out / "summary.md").read_text()
    # The other suites (they were tests/test_benchmark.py's end-to-end run).
    assert [r["T"] for r in bench["honesty"]] == [128, 256]
    assert all(r["ours_over_dense"] > 0 for r in bench["honesty"])
    assert [r["T"] for r in bench["memory"]] == [128, 256]
    assert all(r["orthros"]["cache_plus_params_bytes"] > 0 for r in bench["memory"])
    assert [r["block"] for r in bench["window"]] == [4, 8]
    assert all(r["ms_per_chunk_layer"] > 0 for r in bench["window"])
    inf = bench["inference"]
    assert (inf["prompt_len"], inf["new_tokens"], inf["cache_slots"]) == (24, 2, 24 + 2 * 2)
    for arm in ("orthros", "transformer"):
        assert inf[arm]["ttft_s"] > 0 and inf[arm]["decode_step_tok_s"] > 0
        assert sorted(inf[arm]["timing"]) == ["decode_step", "generate_1", "generate_n", "ttft"]
    tab = bench["table4"]
    assert [r["T"] for r in tab["prefill"]] == [40]
    assert [r["context"] for r in tab["decode"]] == [32]
    for row in (*tab["prefill"], *tab["decode"]):
        assert row["hybrid_over_orthros_h"] > 0 and row["transformer_over_orthros"] > 0
    assert tab["models"]["orthros_h"]["layer_types"] == ["gdn", "gdn", "gdn", "attention"]
    table4_md = (out / "bench" / "table4.md").read_text()
    assert "| 40 |" in table4_md
    for arm, kind in (("gdn", "gdn"), ("gla", "gla"), ("retnet", "retention")):
        assert tab["decode"][0][f"{arm}_over_transformer"] > 0
        assert tab["models"][arm]["layer_types"] == [kind]
    assert "| decode context | transformer ms | gdn ms |" in table4_md


def test_summary_mfu_from_peak():
    # An H100's peak is 989.4 TFLOP/s: 494,700 GFLOP in 1 s is 50%, 247,350 GFLOP in 2 s 12.5%.
    bench = {
        "device": "NVIDIA H100 80GB HBM3",
        "backend": "gpu",
        "jax": "0.10.2",
        "command": "x",
        "train": {
            "T": 2048,
            "orthros": {"median_s": 1.0, "gflop": 494700.0},
            "transformer": {"median_s": 2.0, "gflop": 247350.0},
        },
    }
    text = summary(bench)
    assert "| orthros | 1.0000 | 494700.0 | 50.0% |" in text
    assert "| transformer | 2.0000 | 247350.0 | 12.5% |" in text
