"""benchmarks/device_check.sh --dry-run on CPU at tiny sizes: every step runs and writes its
files under the one output folder; the summary is built from the benchmark's own numbers. Its
launch/benchmark.py run is also the end-to-end check of the prefill, decode and train suites
(tests/test_benchmark.py runs the other suites)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.device_report import summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_dry_run_writes_every_output(tmp_path):
    out = tmp_path / "check"
    env = dict(os.environ, PYTHON=sys.executable)
    subprocess.run(
        ["bash", "benchmarks/device_check.sh", str(out), "--dry-run"],
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
    assert "| T |" in (out / "bench" / "bench.md").read_text()


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
