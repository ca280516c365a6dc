"""Preemption in process: SIGINT during train() finishes the update, writes a checkpoint and
returns; rerunning resumes to the params of an uninterrupted run (bit for bit). SIGTERM to
launch/train.py (exit 0, the line saying so, records and data order resumed):
tests/test_prepared_resume.py; two processes: tests/test_multiprocess_preemption.py."""

from __future__ import annotations

import dataclasses
import signal

import numpy as np
import pytest
from resume_helpers import saved_steps, signal_at
from training_helpers import pt_dataset, tiny_train_config

from orthros_jax.training import train


def _leaves(tree) -> list[np.ndarray]:
    import jax

    return [np.asarray(v) for v in jax.tree.leaves(tree)]


@pytest.mark.slow
@pytest.mark.parametrize("trainable", ["all", "lora"])
def test_sigint_in_process_checkpoints_and_resumes(tmp_path, trainable):
    """train() itself: SIGINT mid-run returns after a checkpoint (no KeyboardInterrupt); the
    rerun ends at the uninterrupted run's params; the previous handler is restored. "lora": a
    LoRA run training adapters + SO only (frozen weights have no optimizer state)."""
    steps = 8
    cfg = tiny_train_config(n_layers=1, steps=steps, checkpoint_every=0, log_every=1)
    if trainable == "lora":
        model = cfg.model.replace(lora=dict(rank=2, alpha=4.0, dropout=0.5))
        loop = dataclasses.replace(cfg.train, trainable="lora")
        cfg = dataclasses.replace(cfg, model=model, train=loop)
    before = signal.getsignal(signal.SIGINT)
    full = train(
        cfg, str(tmp_path / "full"), train_iterator=iter(pt_dataset(4, 16)), eval_batches=[]
    )
    workdir = str(tmp_path / "cut")
    it = iter(signal_at(signal.SIGINT, 3, pt_dataset(4, 16)))
    cut = train(cfg, workdir, train_iterator=it, eval_batches=[])
    assert signal.getsignal(signal.SIGINT) is before
    saved = saved_steps(workdir)
    assert len(saved) == 1 and 3 <= saved[0] < steps and int(cut.step) == saved[0], saved
    resumed = train(cfg, workdir, train_iterator=iter(pt_dataset(4, 16)), eval_batches=[])
    assert int(resumed.step) == steps
    for x, y in zip(_leaves(resumed.params), _leaves(full.params), strict=True):
        np.testing.assert_array_equal(x, y)
