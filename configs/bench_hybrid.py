"""Benchmark config of the Table 4 suite (orthros_jax/bench_table4.py): the bench model of
configs/bench.py plus the GDN dims of its hybrid arms, and the suite's sizes.

    python -m orthros_jax.bench_table4 --config=configs/bench_hybrid.py --out=docs/bench/table4
"""

import importlib.util
import os

import ml_collections


def _bench_config() -> ml_collections.ConfigDict:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py")
    spec = importlib.util.spec_from_file_location("_bench_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config() -> ml_collections.ConfigDict:
    c = _bench_config()
    # Qwen3.5's proportions at the bench width: value heads twice the key heads, dims 64.
    c.gdn = ml_collections.ConfigDict(
        dict(gdn_num_k_heads=4, gdn_num_v_heads=8, gdn_k_head_dim=64, gdn_v_head_dim=64,
             gdn_conv_kernel=4, gdn_chunk=64)
    )  # fmt: skip
    # The shared 2-core CPU box: lengths up to 8K keep one run under half an hour.
    c.table4_lengths = (1024, 2048, 4096, 8192)
    c.table4_contexts = (1024, 4096, 8192)
    c.decode_steps = 8
    c.repeats = 3
    return c
