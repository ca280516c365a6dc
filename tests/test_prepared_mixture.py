"""Mixtures of prepared datasets: realized shares logged, deterministic, resumable; eval draws
from every dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_prepared_data import HOST, _jsonl, _same, _texts, run_prepare

from orthros_jax.data import pipeline
from orthros_jax.data.config import DataConfig


@pytest.fixture
def two_datasets(tmp_path):
    """Two prepared datasets whose documents start with 'A' / 'B' (same length law)."""
    outs = []
    for name in ("A", "B"):
        texts = _texts(ord(name), 80, prefix=name)
        run_prepare([_jsonl(tmp_path / f"{name}.jsonl", texts)], tmp_path / name)
        outs.append(str(tmp_path / name))
    return outs


def test_mixture_proportions_logged_deterministic_and_resumable(two_datasets):
    cfg = DataConfig(
        prepared=tuple(two_datasets),
        mixture_weights=(3.0, 1.0),
        seq_len=128,
        batch_size=4,
        validation_fraction=0.0,
    )
    it = pipeline.make_train_iterator(cfg, **HOST)
    first = [next(it) for _ in range(30)]
    # Each 128-token row holds whole documents (< 100 chars): a segment's first byte names it.
    counts = {"A": 0, "B": 0}
    for b in first:
        for r in range(4):
            seg = b["segment_ids"][r]
            for s in range(1, int(seg.max()) + 1):
                idx = seg == s
                counts[chr(int(b["tokens"][r][idx][0]))] += int(b["loss_mask"][r][idx].sum())
    shares = it.metrics()
    total = counts["A"] + counts["B"]
    np.testing.assert_allclose(shares["mix/A"], counts["A"] / total, rtol=0, atol=1e-12)
    np.testing.assert_allclose(shares["mix/B"], counts["B"] / total, rtol=0, atol=1e-12)
    assert 0.65 < shares["mix/A"] < 0.85  # 3:1 by element, documents of one length law
    state = json.loads(json.dumps(it.get_state()))
    expected = [next(it) for _ in range(10)]
    resumed = pipeline.make_train_iterator(cfg, **HOST)
    resumed.set_state(state)
    assert resumed.metrics() == shares
    _same(expected, [next(resumed) for _ in range(10)])
    assert resumed.metrics() == it.metrics()
    fresh = pipeline.make_train_iterator(cfg, **HOST)
    _same(first, [next(fresh) for _ in range(30)])  # deterministic
    assert "source" not in first[0]  # taken off before the batch reaches the model


def test_mixture_eval_batches_draw_from_every_dataset(two_datasets):
    cfg = DataConfig(
        prepared=tuple(two_datasets), seq_len=128, batch_size=4, validation_fraction=0.3
    )
    evals = pipeline.make_eval_batches(cfg, **HOST)
    firsts = {  # the first token of every segment (a document's, each < 128 tokens) names it
        chr(int(b["tokens"][r][b["positions"][r] == 0][k]))
        for b in evals
        for r in range(4)
        for k in range(int(b["segment_ids"][r].max()))
    }
    assert firsts == {"A", "B"}
    assert all(
        np.array_equal(x["tokens"], y["tokens"])
        for x, y in zip(evals, pipeline.make_eval_batches(cfg.replace(seed=7), **HOST), strict=True)
    )
