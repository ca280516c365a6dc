"""Two processes (jax.distributed.initialize on localhost, 2 CPU devices each) train together
on a fsdp=2 x tensor=2 mesh through training.train(): they agree with each other and with the
same run on one device."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

STEPS, ROWS = 3, 8


def _local_rows(batch: dict, index: int, count: int) -> dict:
    n = ROWS // count
    return {k: v[index * n : (index + 1) * n] for k, v in batch.items()}


def _config(distributed=None, mesh=None):
    from training_helpers import tiny_train_config

    # One layer: the point is the two processes, and it compiles faster.
    cfg = tiny_train_config(n_layers=1, steps=STEPS, checkpoint_every=STEPS)
    changes = {k: v for k, v in (("distributed", distributed), ("mesh", mesh)) if v is not None}
    return dataclasses.replace(cfg, **changes)


def _run(workdir: str, index: int, count: int, cfg) -> dict[str, np.ndarray]:
    """train() on this process's rows of the synthetic batches; all params gathered to host."""
    import jax
    from jax.experimental import multihost_utils
    from training_helpers import pt_dataset

    from orthros_jax.training import train

    it = iter(pt_dataset(batch=ROWS).map(lambda b: _local_rows(b, index, count)))
    state = train(cfg, workdir, train_iterator=it, eval_batches=[])  # no eval: one compile less
    params = multihost_utils.process_allgather(state.params, tiled=True)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in flat}


def _worker(index: int, port: int, out: str) -> None:
    from orthros_jax.training import DistributedConfig, MeshConfig

    dist = DistributedConfig(True, f"localhost:{port}", 2, index)
    cfg = _config(distributed=dist, mesh=MeshConfig(data=1, fsdp=2, tensor=2))
    params = _run(os.path.join(out, "workdir"), index, 2, cfg)
    import jax

    assert jax.process_count() == 2 and jax.device_count() == 4
    np.savez(os.path.join(out, f"process{index}.npz"), **params)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_train_together(tmp_path):
    import json

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
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]
    p0, p1 = (np.load(tmp_path / f"process{i}.npz") for i in range(2))
    # The single-device run of the same global batches (this pytest process, 1 device).
    ref = _run(str(tmp_path / "single"), 0, 1, _config())
    for key in ref:
        np.testing.assert_array_equal(p0[key], p1[key], err_msg=key)
        np.testing.assert_allclose(p0[key], ref[key], atol=1e-5, rtol=0, err_msg=key)
    lines = [
        json.loads(x) for x in (tmp_path / "workdir" / "metrics.jsonl").read_text().split("\n") if x
    ]
    ref_lines = [
        json.loads(x) for x in (tmp_path / "single" / "metrics.jsonl").read_text().split("\n") if x
    ]
    for a, b in zip(lines, ref_lines, strict=True):
        np.testing.assert_allclose(a["loss"], b["loss"], atol=1e-5, rtol=0)
    assert sorted(os.listdir(tmp_path / "workdir" / "checkpoints")) == [str(STEPS)]


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
