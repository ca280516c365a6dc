"""Exact resume: launch/train.py killed with SIGKILL after a checkpoint, then rerun on the same
workdir, ends with the params (<= 1e-6) and data order of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
from training_helpers import REPO, TINY_FLAGS, run_train

from orthros_jax import checkpoint

STEPS = 150
FLAGS = [
    *TINY_FLAGS,
    f"--config.train.steps={STEPS}",
    "--config.train.checkpoint_every=10",
    "--config.train.log_every=5",  # steps logged after the kept checkpoint are replayed
    "--config.train.eval_every=0",
    "--config.train.data_fingerprints=True",
]


def _env(tmp_path) -> dict[str, str]:
    # A shared compilation cache: the three runs compile the same program once.
    return dict(
        os.environ,
        JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )


def _fingerprints(workdir: str) -> dict[int, int]:
    """micro step -> crc32 of its batch; a step logged twice (killed, then redone) keeps its
    last value, which is the one the surviving run trained on."""
    out = {}
    with open(os.path.join(workdir, "data_fingerprints_p0.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            out[row["micro_step"]] = row["crc32"]
    return out


def _finished_steps(workdir: str) -> list[int]:
    ckpts = os.path.join(workdir, "checkpoints")
    return sorted(int(d) for d in os.listdir(ckpts) if d.isdigit()) if os.path.isdir(ckpts) else []


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    env = _env(tmp_path)
    full = str(tmp_path / "full")
    done = run_train([*FLAGS, f"--workdir={full}"], env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = str(tmp_path / "killed")
    proc = subprocess.Popen(
        [sys.executable, "launch/train.py", *FLAGS, f"--workdir={killed}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while not _finished_steps(killed) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed; raise STEPS"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = _finished_steps(killed)
    assert at_kill and at_kill[-1] < STEPS, at_kill

    resumed = run_train([*FLAGS, f"--workdir={killed}"], env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr

    a, b = checkpoint.load_model(full), checkpoint.load_model(killed)
    flat_a = {k: np.asarray(v) for k, v in _flatten(a.params).items()}
    flat_b = {k: np.asarray(v) for k, v in _flatten(b.params).items()}
    assert flat_a.keys() == flat_b.keys()
    for k in flat_a:
        np.testing.assert_allclose(flat_b[k], flat_a[k], atol=1e-6, rtol=0, err_msg=k)
    fa, fb = _fingerprints(full), _fingerprints(killed)
    assert sorted(fa) == list(range(STEPS)) and fb == fa  # same batches in the same order
    # metrics.jsonl: every logged step once, as in the uninterrupted run.
    assert _logged_steps(killed) == _logged_steps(full) == list(range(5, STEPS + 1, 5))


def _logged_steps(workdir: str) -> list[int]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r["step"] for r in map(json.loads, f) if r["split"] == "train"]


def _flatten(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}/")
        else:
            out[prefix + k] = v
    return out
