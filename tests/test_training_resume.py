"""Exact resume: launch/train.py killed with SIGKILL after a checkpoint, then rerun on the same
workdir, ends with the params (<= 1e-6) and data order of an uninterrupted run. The model is
the two-stream hybrid (a GDN layer beside attention): its recurrent kind's parameters and
optimizer state go through the checkpoint too."""

from __future__ import annotations

import pytest
from resume_helpers import assert_same_run, sigkill_and_resume, train_records
from training_helpers import TINY_FLAGS

STEPS = 150
FLAGS = [
    *TINY_FLAGS,
    f"--config.train.steps={STEPS}",
    "--config.train.checkpoint_every=10",
    "--config.train.log_every=5",  # steps logged after the kept checkpoint are replayed
    "--config.train.eval_every=0",
    "--config.train.data_fingerprints=True",
    "--config.model.architecture=orthros_h",
    "--config.model.layer_types=('gdn','attention')",
    "--config.model.kinds.gdn.num_k_heads=1",
    "--config.model.kinds.gdn.num_v_heads=2",
    "--config.model.kinds.gdn.k_head_dim=16",
    "--config.model.kinds.gdn.v_head_dim=16",
    "--config.model.kinds.gdn.chunk=16",
]


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    full, killed = sigkill_and_resume(FLAGS, tmp_path, STEPS, timeout=300)
    assert_same_run(full, killed, STEPS, atol=1e-6)
    # metrics.jsonl: every logged step once, as in the uninterrupted run.
    logged = [[r["step"] for r in train_records(w)] for w in (full, killed)]
    assert logged[0] == logged[1] == list(range(5, STEPS + 1, 5))
