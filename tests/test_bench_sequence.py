"""benchmarks/sequence.py's report: the headline ratios and the Markdown / plot written from a
sequence-parallel benchmark's results (fixed numbers, so each line is checked exactly)."""

from __future__ import annotations


def test_bench_sequence_headline_and_report(tmp_path):
    from benchmarks import sequence as bench_sequence

    timing = lambda s: {"median_s": s, "times_s": [s]}
    mem = lambda peak, resident: {
        "peak_bytes": peak,
        "cache_shard_plus_params_bytes": resident,
        "peak_over_resident": peak / resident,
    }
    scaling = [
        {"T": 1024, "orthros": timing(1.0), "memory": mem(110, 100)},
        {
            "T": 2048,
            "orthros": timing(2.1),
            "time_over_previous": 2.1,
            "cpu_over_previous": 1.9,
            "memory": mem(250, 200),
        },
        {
            "T": 4096,
            "orthros": timing(4.0),
            "time_over_previous": 4.0 / 2.1,
            "cpu_over_previous": 2.05,
            "memory": mem(440, 400),
        },
    ]
    zero = dict.fromkeys(("all-gather", "collective-permute", "all-reduce"), 0)
    seq = {
        "devices": 8,
        "device_kind": "cpu",
        "scaling": scaling,
        "collectives": {
            "T": 4096,
            "orthros": {**zero, "collective-permute": 30},
            "transformer": {**zero, "all-gather": 6000},
            "orthros_over_transformer": 30 / 6000,
        },
        "transformer": [
            {
                "T": 512,
                "orthros": timing(0.5),
                "transformer": timing(1.5),
                "transformer_over_orthros": 3.0,
            }
        ],
        "single": {
            "T": 1024,
            "sp": timing(1.2),
            "single": timing(1.0),
            "sp_over_single": 1.2,
            "sp_over_single_cpu": 1.1,
            "max_abs_logit_diff": 2e-7,
        },
    }
    seq["headline"] = bench_sequence.headline(seq)
    assert seq["headline"] == {
        "doubling": 2.1,
        "doubling_cpu": 2.05,
        "memory": 1.1,
        "memory_worst": 1.25,
        "collectives": 0.005,
        "single": 1.2,
        "single_cpu": 1.1,
    }
    results = {
        "sequence": seq,
        "date": "d",
        "backend": "cpu",
        "cpu_count": 2,
        "jax": "v",
        "command": "cmd",
        "wall_s": 9.0,
    }
    bench_sequence.write_report(results, str(tmp_path))
    md = (tmp_path / "sequence.md").read_text()
    assert "| 2048 | 2.10 | 2.100 | — | 1.900 | 0.0 | 0.0 | 1.250 |" in md
    assert "| orthros | 0 | 30 | 0 |" in md and "| 512 | 0.50 | 1.50 | 3.00 |" in md
    assert "ratio 1.200 (host CPU 1.100); max |logit difference| 2.00e-07" in md
    assert (tmp_path / "sequence.png").stat().st_size > 0
