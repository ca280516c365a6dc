"""Two processes (jax.distributed.initialize on localhost, 2 CPU devices each) train together
on a fsdp=2 x tensor=2 mesh through training.train(), one named end-to-end scenario: a long
run whose SIGTERM reaches only the second process (the one that writes no logs); both still
finish the same update, write one checkpoint together and return, with the same params bit for
bit, and those of the same run on one device stopped after the same update (<= 1e-5)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import free_port

ROWS = 8
# More updates than the test waits for, so the signal must stop the run; the schedule (and so
# the compiled step) depends on it, and the one-device reference runs the same config.
STEPS = 400
MIN_STEPS = 3  # train lines the test waits for before the signal


def _local_rows(batch: dict, index: int, count: int) -> dict:
    n = ROWS // count
    return {k: v[index * n : (index + 1) * n] for k, v in batch.items()}


def _config(distributed=None, mesh=None):
    from training_helpers import tiny_train_config

    # One layer: the point is the two processes, and it compiles faster.
    cfg = tiny_train_config(n_layers=1, steps=STEPS, checkpoint_every=0, log_every=1)
    changes = {k: v for k, v in (("distributed", distributed), ("mesh", mesh)) if v is not None}
    return dataclasses.replace(cfg, **changes)


def _train(workdir: str, index: int, count: int, cfg, stop_after: int | None = None):
    """train() on this process's rows of the synthetic batches; stop_after: the process
    interrupts itself (SIGINT, as Ctrl-C would) while update `stop_after` runs, so the run
    stops after it, as a preempted one does."""
    from resume_helpers import signal_at
    from training_helpers import pt_dataset

    from orthros_jax.training import train

    ds = pt_dataset(batch=ROWS).map(lambda b: _local_rows(b, index, count))
    if stop_after is not None:
        ds = signal_at(signal.SIGINT, stop_after - 1, ds)
    return train(cfg, workdir, train_iterator=iter(ds), eval_batches=[])  # no eval


def _gathered(state) -> dict[str, np.ndarray]:
    import jax
    from jax.experimental import multihost_utils

    params = multihost_utils.process_allgather(state.params, tiled=True)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def _worker(index: int, port: int, out: str) -> None:
    import jax

    from orthros_jax.training import DistributedConfig, MeshConfig

    dist = DistributedConfig(True, f"localhost:{port}", 2, index)
    mesh = MeshConfig(data=1, fsdp=2, tensor=2)
    state = _train(os.path.join(out, "preempted"), index, 2, _config(dist, mesh))
    assert jax.process_count() == 2 and jax.device_count() == 4
    np.savez(os.path.join(out, f"process{index}.npz"), **_gathered(state))
    with open(os.path.join(out, f"process{index}.json"), "w") as f:
        json.dump({"step": int(state.step)}, f)


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().split("\n") if x]


@pytest.mark.slow
def test_two_processes_train_together_and_stop_together_on_sigterm(tmp_path):
    from resume_helpers import saved_steps
    from training_helpers import subprocess_env

    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(i), str(port), str(tmp_path)],
            env=subprocess_env(2),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    metrics = tmp_path / "preempted" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and all(p.poll() is None for p in procs):
        if metrics.is_file() and metrics.read_text().count('"split": "train"') >= MIN_STEPS:
            break
        time.sleep(0.05)
    assert all(p.poll() is None for p in procs), "a process ended before the signal"
    procs[1].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]

    # Both processes stopped after the same update, its one checkpoint.
    steps = [json.loads((tmp_path / f"process{i}.json").read_text())["step"] for i in range(2)]
    saved = saved_steps(str(tmp_path / "preempted"))
    assert steps[0] == steps[1] and saved == [steps[0]] and MIN_STEPS <= steps[0] < STEPS, (
        steps,
        saved,
    )
    assert f"wrote the checkpoint of step {steps[0]}" in outputs[0], outputs[0][-2000:]

    # The processes agree bit for bit, and with the run on one device (this pytest process)
    # stopped after the same update (<= 1e-5).
    p0, p1 = (np.load(tmp_path / f"process{i}.npz") for i in range(2))
    single = _train(str(tmp_path / "single"), 0, 1, _config(), stop_after=steps[0])
    assert int(single.step) == steps[0]
    ref = _gathered(single)
    for key in ref:
        np.testing.assert_array_equal(p0[key], p1[key], err_msg=key)
        np.testing.assert_allclose(p0[key], ref[key], atol=1e-5, rtol=0, err_msg=key)
    lines, ref_lines = _lines(metrics), _lines(tmp_path / "single" / "metrics.jsonl")
    train_lines = [x for x in lines if x.get("split") == "train"]
    ref_train = [x for x in ref_lines if x.get("split") == "train"]
    assert len(train_lines) == len(ref_train) == steps[0]
    for a, b in zip(train_lines, ref_train, strict=True):
        np.testing.assert_allclose(a["loss"], b["loss"], atol=1e-5, rtol=0)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
