"""Benchmark suites of launch/benchmark.py and their helpers (outside the library: nothing in
orthros_jax imports this package)."""
