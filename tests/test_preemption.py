"""Preemption in process: SIGINT during train() finishes the update, writes a checkpoint and
returns; rerunning resumes to the params of an uninterrupted run (bit for bit). SIGTERM to
launch/train.py (exit 0, the line saying so, records and data order resumed):
tests/test_prepared_resume.py; two processes: tests/test_multiprocess_preemption.py."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from resume_helpers import saved_steps
from training_helpers import pt_dataset, tiny_train_config

from orthros_jax.training import train


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
