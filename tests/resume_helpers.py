"""Shared pieces of the kill-and-resume tests (test_prepared_resume, test_preemption): a run's
environment, what it left in its workdir, and the comparison of a resumed run with an
uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
from training_helpers import REPO, run_train

from orthros_jax import checkpoint


def run_env() -> dict[str, str]:
    """The runs' environment: conftest's compilation cache of the whole test run (in
    os.environ), so the runs compile each program once, and a program another test compiled
    (the same tiny model) is loaded, not compiled again."""
    assert "JAX_COMPILATION_CACHE_DIR" in os.environ  # set by tests/conftest.py
    return dict(os.environ)


def fingerprints(workdir: str) -> dict[int, int]:
    """micro step -> crc32 of its batch; a step logged twice (killed, then redone) keeps its
    last value, which is the one the surviving run trained on."""
    out = {}
    with open(os.path.join(workdir, "data_fingerprints_p0.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            out[row["micro_step"]] = row["crc32"]
    return out


def saved_steps(workdir: str) -> list[int]:
    """The steps of the checkpoints in workdir (ascending)."""
    ckpts = os.path.join(workdir, "checkpoints")
    return sorted(int(d) for d in os.listdir(ckpts) if d.isdigit()) if os.path.isdir(ckpts) else []


def train_records(workdir: str) -> list[dict]:
    """metrics.jsonl's train records ([] before the first)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["split"] == "train"]


def flat_params(workdir: str) -> dict[str, np.ndarray]:
    """The final model's params of a run, flattened to 'a/b/c' -> array."""

    def flatten(tree, prefix=""):
        out = {}
        for k, v in tree.items():
            if isinstance(v, dict):
                out |= flatten(v, f"{prefix}{k}/")
            else:
                out[prefix + k] = np.asarray(v)
        return out

    return flatten(checkpoint.load_model(workdir).params)


def start_train(
    flags: list[str], workdir: str, env: dict, ready: Callable[[], bool], timeout: int
) -> subprocess.Popen:
    """launch/train.py on `workdir` in the background (stdout / stderr piped, text), returned
    once `ready()` holds, for a test to signal; fails if the run ended first."""
    proc = subprocess.Popen(
        [sys.executable, "launch/train.py", *flags, f"--workdir={workdir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + timeout
    while not ready() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before the signal; raise its steps"
    return proc


def sigkill_and_resume(flags: list[str], tmp_path, steps: int, timeout: int) -> tuple[str, str]:
    """An uninterrupted launch/train.py run, and one killed with SIGKILL after its first
    checkpoint and rerun on its workdir. Returns the two workdirs (full, killed)."""
    env = run_env()
    full = str(tmp_path / "full")
    done = run_train([*flags, f"--workdir={full}"], env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = str(tmp_path / "killed")
    proc = start_train(flags, killed, env, lambda: bool(saved_steps(killed)), timeout)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()  # drains the pipes start_train opened
    at_kill = saved_steps(killed)
    assert at_kill and at_kill[-1] < steps, at_kill

    resumed = run_train([*flags, f"--workdir={killed}"], env=env, timeout=timeout)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    return full, killed


def assert_same_run(full: str, other: str, steps: int, atol: float) -> None:
    """other ended at full's params (<= atol; 0: bit for bit) after the same batches."""
    a, b = flat_params(full), flat_params(other)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], atol=atol, rtol=0, err_msg=k)
    fa, fb = fingerprints(full), fingerprints(other)
    assert sorted(fa) == list(range(steps)) and fb == fa  # same batches in the same order


def signal_at(signum: int, index: int, ds):
    """ds whose batch number `index` (counting from this iterator's start) sends `signum` to
    this process as it is made; still a grain IterDataset (its position is checkpointed)."""
    made = iter(range(10**9))

    def maybe_signal(batch: dict) -> dict:
        if next(made) == index:
            os.kill(os.getpid(), signum)
        return batch

    return ds.map(maybe_signal)
