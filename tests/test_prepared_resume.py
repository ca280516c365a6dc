"""launch/train.py on a mixture of two prepared datasets, killed with SIGKILL after a checkpoint
and rerun: the same params (<= 1e-6), batches and logged mixture shares as an uninterrupted run."""

from __future__ import annotations

import pytest
from resume_helpers import assert_same_run, sigkill_and_resume, train_records
from test_prepared_data import _jsonl, _texts, run_prepare
from test_training_resume import FLAGS, STEPS


@pytest.mark.slow
def test_sigkill_then_resume_on_a_prepared_mixture(tmp_path):
    data = []
    for name in ("web", "books"):
        texts = _texts(len(name), 200, prefix=name)
        run_prepare([_jsonl(tmp_path / f"{name}.jsonl", texts)], tmp_path / name)
        data.append(str(tmp_path / name))
    flags = [
        *FLAGS,
        f"--config.data.prepared={tuple(data)!r}",  # ml_collections parses a tuple's repr
        "--config.data.mixture_weights=(3.0, 1.0)",
    ]
    full, killed = sigkill_and_resume(flags, tmp_path, STEPS, timeout=900)
    assert_same_run(full, killed, STEPS, atol=1e-6)
    ra, rb = train_records(full), train_records(killed)
    shares = [(r["step"], r["mix/web"], r["mix/books"]) for r in ra]
    assert shares == [(r["step"], r["mix/web"], r["mix/books"]) for r in rb]
    assert 0.6 < shares[-1][1] < 0.9 and abs(shares[-1][1] + shares[-1][2] - 1) < 1e-12
