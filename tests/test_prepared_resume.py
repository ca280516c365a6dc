"""launch/train.py on a mixture of two prepared datasets, killed with SIGKILL after a checkpoint
and rerun: the same params (<= 1e-6), batches and logged mixture shares as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from test_prepared_data import _jsonl, _texts, run_prepare
from test_training_resume import FLAGS, STEPS, _env, _fingerprints, _finished_steps, _flatten
from training_helpers import REPO, run_train

from orthros_jax import checkpoint


def _train_records(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == "train"]


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
    env = _env(tmp_path)
    full = str(tmp_path / "full")
    done = run_train([*flags, f"--workdir={full}"], env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = str(tmp_path / "killed")
    proc = subprocess.Popen(
        [sys.executable, "launch/train.py", *flags, f"--workdir={killed}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    while not _finished_steps(killed) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed; raise STEPS"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = _finished_steps(killed)
    assert at_kill and at_kill[-1] < STEPS, at_kill

    resumed = run_train([*flags, f"--workdir={killed}"], env=env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr

    a, b = checkpoint.load_model(full), checkpoint.load_model(killed)
    flat_a, flat_b = _flatten(a.params), _flatten(b.params)
    assert flat_a.keys() == flat_b.keys()
    for k in flat_a:
        np.testing.assert_allclose(
            np.asarray(flat_b[k]), np.asarray(flat_a[k]), atol=1e-6, rtol=0, err_msg=k
        )
    fa, fb = _fingerprints(full), _fingerprints(killed)
    assert sorted(fa) == list(range(STEPS)) and fb == fa  # same batches in the same order
    ra, rb = _train_records(full), _train_records(killed)
    shares = [(r["step"], r["mix/web"], r["mix/books"]) for r in ra]
    assert shares == [(r["step"], r["mix/web"], r["mix/books"]) for r in rb]
    assert 0.6 < shares[-1][1] < 0.9 and abs(shares[-1][1] + shares[-1][2] - 1) < 1e-12
