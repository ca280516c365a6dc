"""Preemption across processes: two processes (jax.distributed.initialize on localhost, 2 CPU
devices each) train together; SIGTERM reaches only the second one (the one that writes no
logs), and both still finish the same update, write one checkpoint together and return."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

STEPS, ROWS = 400, 8  # more updates than the test waits for: the signal must stop the run


def _worker(index: int, port: int, out: str) -> None:
    from test_multiprocess import _local_rows
    from training_helpers import pt_dataset, tiny_train_config

    from orthros_jax.training import DistributedConfig, MeshConfig, train

    cfg = tiny_train_config(n_layers=1, steps=STEPS, checkpoint_every=0, log_every=1)
    cfg = dataclasses.replace(
        cfg,
        distributed=DistributedConfig(True, f"localhost:{port}", 2, index),
        mesh=MeshConfig(data=1, fsdp=2, tensor=2),
    )
    it = iter(pt_dataset(batch=ROWS).map(lambda b: _local_rows(b, index, 2)))
    state = train(cfg, os.path.join(out, "workdir"), train_iterator=it, eval_batches=[])
    with open(os.path.join(out, f"process{index}.json"), "w") as f:
        json.dump({"step": int(state.step)}, f)


@pytest.mark.slow
def test_sigterm_on_one_process_stops_both_at_the_same_step(tmp_path):
    from resume_helpers import saved_steps
    from test_multiprocess import _free_port
    from training_helpers import subprocess_env

    port = _free_port()
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
    metrics = tmp_path / "workdir" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and all(p.poll() is None for p in procs):
        if metrics.is_file() and metrics.read_text().count('"split": "train"') >= 3:
            break
        time.sleep(0.05)
    assert all(p.poll() is None for p in procs), "a process ended before the signal"
    procs[1].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]
    steps = [json.loads((tmp_path / f"process{i}.json").read_text())["step"] for i in range(2)]
    saved = saved_steps(str(tmp_path / "workdir"))
    assert steps[0] == steps[1] and saved == [steps[0]] and 3 <= steps[0] < STEPS, (steps, saved)
    assert f"wrote the checkpoint of step {steps[0]}" in outputs[0], outputs[0][-2000:]


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
