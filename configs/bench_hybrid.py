"""Benchmark config of a Table 4 run on a 2-core CPU (launch/benchmark.py --suites=table4): the
bench model and GDN dims of configs/bench.py, with lengths and rounds that keep one run under
half an hour.

    python launch/benchmark.py --config=configs/bench_hybrid.py --suites=table4 \
        --out=docs/bench/table4
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py"))
    c.table4_lengths = (1024, 2048, 4096, 8192)
    c.table4_contexts = (1024, 4096, 8192)
    c.decode_steps = 8
    c.repeats = 3
    return c
