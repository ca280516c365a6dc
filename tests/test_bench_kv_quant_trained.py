"""benchmarks/kv_quant_trained.py's evaluation on a saved tiny model, with generate replaced by
one that answers every passkey prompt right except one row of the int8 cache: each dtype's
accuracy and agreement with the full-precision cache are counted from the rows, and every
cache dtype asked for reaches generate."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest
from helpers import tiny_config

from benchmarks import kv_quant_trained
from orthros_jax import checkpoint
from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.model import init_params
from orthros_jax.rl import tasks
from orthros_jax.rl.config import TaskConfig


@pytest.mark.slow
def test_evaluate_counts_accuracy_and_agreement_per_cache_dtype(tmp_path, monkeypatch):
    cfg = tiny_config()
    checkpoint.save_model(str(tmp_path), cfg, init_params(cfg, jax.random.PRNGKey(0)))
    tok = ByteTokenizer()
    task = tasks.make_task(TaskConfig(name="passkey", context_len=128, digits=2), tok)
    answers = {}
    for i in range(6):
        prompt = task.prompt(0, tasks.EVAL_STREAM, i)
        answers[tuple(prompt.ids.tolist())] = prompt.answer
    calls = []

    def fake_generate(params, ids, cfg, *, max_new_tokens, kv_cache_dtype):
        calls.append((len(ids), kv_cache_dtype))
        rows = [tok.encode(answers[tuple(r)])[:max_new_tokens] for r in ids]
        if kv_cache_dtype == "int8" and len(calls) == 3:  # the int8 pass's first batch
            rows[0] = tok.encode("xx")
        return types.SimpleNamespace(tokens=rows)

    monkeypatch.setattr(kv_quant_trained, "generate", fake_generate)
    got = kv_quant_trained.evaluate(str(tmp_path), ["int8"], n=6, new=2, batch=4)
    assert calls == [(4, None), (2, None), (4, "int8"), (2, "int8")]
    assert got["full"] == {"accuracy": 1.0, "agreement": 1.0}
    assert set(got) == {"full", "int8"}
    np.testing.assert_allclose(list(got["int8"].values()), [5 / 6, 5 / 6], rtol=1e-6)
