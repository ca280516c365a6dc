"""Preemption: SIGTERM / SIGINT during training finishes the update, writes a checkpoint and
exits 0 with a line saying so; rerunning resumes to the params, data order and metrics of an
uninterrupted run (bit for bit). Two processes: tests/test_multiprocess_preemption.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from resume_helpers import assert_same_run, run_env, saved_steps
from training_helpers import REPO, TINY_FLAGS, pt_dataset, run_train, tiny_train_config

from orthros_jax.training import train

STEPS = 120
FLAGS = [
    *TINY_FLAGS,
    f"--config.train.steps={STEPS}",
    "--config.train.checkpoint_every=0",  # only the preemption's and the final checkpoint
    "--config.train.log_every=5",
    "--config.train.eval_every=40",
    "--config.train.data_fingerprints=True",
]
TIMING = ("tokens_per_s", "tokens_per_s_per_device", "model_tflops_per_device", "mfu")


def _records(workdir: str) -> list[dict]:
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


@pytest.mark.slow
def test_sigterm_checkpoints_exits_0_and_resumes_bit_for_bit(tmp_path):
    env = run_env(tmp_path)
    full = str(tmp_path / "full")
    done = run_train([*FLAGS, f"--workdir={full}"], env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    cut = str(tmp_path / "cut")
    proc = subprocess.Popen(
        [sys.executable, "launch/train.py", *FLAGS, f"--workdir={cut}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while _train_lines(cut) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)  # two log lines: compiled and training
    assert proc.poll() is None, "the run ended before the signal; raise STEPS"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    saved = saved_steps(cut)
    assert len(saved) == 1 and 10 <= saved[0] < STEPS, saved
    assert f"preempted by SIGTERM: wrote the checkpoint of step {saved[0]}" in out, out[-2000:]
    assert "received SIGTERM: finishing the current update" in err

    resumed = run_train([*FLAGS, f"--workdir={cut}"], env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {os.path.join(cut, 'checkpoints')} at step {saved[0]}" in resumed.stdout

    assert_same_run(full, cut, STEPS, atol=0.0)  # bit for bit
    # Every record equal, but the train line of the log window the preemption cut (after the
    # resume it averages only the steps since).
    straddling = (saved[0] // 5 + 1) * 5 if saved[0] % 5 else None
    ra = [r for r in _records(full) if not (r["split"] == "train" and r["step"] == straddling)]
    rb = [r for r in _records(cut) if not (r["split"] == "train" and r["step"] == straddling)]
    assert ra == rb and len(ra) >= STEPS // 5


def _signal_at(signum: int, index: int, ds):
    """ds whose batch number `index` (counting from this iterator's start) sends `signum` to
    this process as it is made; still a grain IterDataset (its position is checkpointed)."""
    made = iter(range(10**9))

    def maybe_signal(batch: dict) -> dict:
        if next(made) == index:
            os.kill(os.getpid(), signum)
        return batch

    return ds.map(maybe_signal)


def _leaves(tree) -> list[np.ndarray]:
    import jax

    return [np.asarray(v) for v in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_sigint_in_process_checkpoints_and_resumes(tmp_path):
    """train() itself: SIGINT mid-run returns after a checkpoint (no KeyboardInterrupt); the
    rerun ends at the uninterrupted run's params; the previous handler is restored."""
    steps = 8
    cfg = tiny_train_config(n_layers=1, steps=steps, checkpoint_every=0, log_every=1)
    before = signal.getsignal(signal.SIGINT)
    full = train(
        cfg, str(tmp_path / "full"), train_iterator=iter(pt_dataset(4, 16)), eval_batches=[]
    )
    workdir = str(tmp_path / "cut")
    it = iter(_signal_at(signal.SIGINT, 3, pt_dataset(4, 16)))
    cut = train(cfg, workdir, train_iterator=it, eval_batches=[])
    assert signal.getsignal(signal.SIGINT) is before
    saved = saved_steps(workdir)
    assert len(saved) == 1 and 3 <= saved[0] < steps and int(cut.step) == saved[0], saved
    resumed = train(cfg, workdir, train_iterator=iter(pt_dataset(4, 16)), eval_batches=[])
    assert int(resumed.step) == steps
    for x, y in zip(_leaves(resumed.params), _leaves(full.params), strict=True):
        np.testing.assert_array_equal(x, y)
