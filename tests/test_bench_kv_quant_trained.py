"""benchmarks/kv_quant_trained.py's evaluation on a saved tiny model: every cache dtype gets an
accuracy and an agreement with the full-precision cache, which agrees with itself."""

from __future__ import annotations

import jax
import pytest
from helpers import tiny_config

from benchmarks import kv_quant_trained
from orthros_jax import checkpoint
from orthros_jax.model import init_params


@pytest.mark.slow
def test_evaluate_reports_accuracy_and_agreement_per_cache_dtype(tmp_path):
    cfg = tiny_config()
    checkpoint.save_model(str(tmp_path), cfg, init_params(cfg, jax.random.PRNGKey(0)))
    got = kv_quant_trained.evaluate(str(tmp_path), ["int8"], n=6, new=2, batch=4)
    assert set(got) == {"full", "int8"}
    assert got["full"]["agreement"] == 1.0
    for v in got.values():
        assert 0.0 <= v["accuracy"] <= 1.0 and 0.0 <= v["agreement"] <= 1.0
