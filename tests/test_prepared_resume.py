"""Exact resume through launch/train.py, one named end-to-end scenario (<= 50 s idle) sharing
one uninterrupted run: a run killed with SIGKILL after a checkpoint, and one stopped with
SIGTERM (which finishes the update, writes a checkpoint and exits 0 saying so), each rerun on
its workdir, end with the params, data order and metrics of the uninterrupted run. The data is
a mixture of two prepared datasets (its logged shares resume too); the model is the two-stream
hybrid (a GDN layer beside attention), so its recurrent kind's parameters and optimizer state go
through the checkpoint too. SIGINT in-process and the corpus pipeline's iterator state:
tests/test_preemption.py and tests/test_data.py; two processes: test_multiprocess_preemption.py."""

from __future__ import annotations

import json
import os
import signal

import pytest
from resume_helpers import (
    assert_same_run,
    run_env,
    saved_steps,
    sigkill_and_resume,
    start_train,
)
from test_prepared_data import _jsonl, _texts, run_prepare
from training_helpers import TINY_FLAGS, run_train

# Enough updates after the first checkpoint (step 10) and after the signal (sent at step ~10)
# that the kill and the signal land before the end.
STEPS = 60
FLAGS = [
    *TINY_FLAGS,
    f"--config.train.steps={STEPS}",
    "--config.train.checkpoint_every=10",
    "--config.train.log_every=5",  # steps logged after the kept checkpoint are replayed
    "--config.train.eval_every=20",
    "--config.train.data_fingerprints=True",
    "--config.model.architecture=orthros_h",
    "--config.model.layer_types=('gdn','attention')",
    "--config.model.kinds.gdn.num_k_heads=1",
    "--config.model.kinds.gdn.num_v_heads=2",
    "--config.model.kinds.gdn.k_head_dim=16",
    "--config.model.kinds.gdn.v_head_dim=16",
    "--config.model.kinds.gdn.chunk=16",
]
TIMING = ("tokens_per_s", "tokens_per_s_per_device", "model_tflops_per_device", "mfu")


def _records(workdir: str) -> list[dict]:
    """metrics.jsonl's records (train and eval) without the timing fields."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in map(json.loads, f)]


def _train_lines(workdir: str) -> int:
    """How many train records metrics.jsonl holds (of a running process: a line may be
    half-written, so it is counted, not parsed)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        return sum('"split": "train"' in line for line in f)


def _sigterm_and_resume(flags: list[str], cut: str) -> int:
    """A run sent SIGTERM after its second log line, then rerun on its workdir; returns the
    step of the preemption's checkpoint."""
    env = run_env()
    # Two log lines: compiled and training.
    proc = start_train(flags, cut, env, lambda: _train_lines(cut) >= 2, timeout=300)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    saved = saved_steps(cut)
    assert saved and 10 <= saved[-1] < STEPS, saved
    assert f"preempted by SIGTERM: wrote the checkpoint of step {saved[-1]}" in out, out[-2000:]
    assert "received SIGTERM: finishing the current update" in err

    resumed = run_train([*flags, f"--workdir={cut}"], env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {os.path.join(cut, 'checkpoints')} at step {saved[-1]}" in resumed.stdout
    return saved[-1]


@pytest.mark.slow
def test_sigkill_and_sigterm_runs_resume_to_the_uninterrupted_run(tmp_path):
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
    full, killed = sigkill_and_resume(flags, tmp_path, STEPS, timeout=600)
    cut = str(tmp_path / "cut")
    stopped_at = _sigterm_and_resume(flags, cut)

    assert_same_run(full, killed, STEPS, atol=1e-6)
    assert_same_run(full, cut, STEPS, atol=0.0)  # bit for bit
    ra = _records(full)
    train = [r for r in ra if r["split"] == "train"]
    assert [r["step"] for r in train] == list(range(5, STEPS + 1, 5))
    assert [r["step"] for r in ra if r["split"] == "eval"] == [20, 40, 60]
    # The killed run: every record once (the replayed steps' lines dropped), as in the full run.
    assert _records(killed) == ra
    # The stopped run: every record equal but the train line of the log window the preemption
    # cut (after the resume it averages only the steps since).
    straddling = (stopped_at // 5 + 1) * 5 if stopped_at % 5 else None
    ra = [r for r in ra if not (r["split"] == "train" and r["step"] == straddling)]
    rc = [r for r in _records(cut) if not (r["split"] == "train" and r["step"] == straddling)]
    assert rc == ra
    # The logged mixture shares follow the weights (3:1).
    web, books = train[-1]["mix/web"], train[-1]["mix/books"]
    assert 0.6 < web < 0.9 and abs(web + books - 1) < 1e-12
