"""The GRPO run end to end: launch/rl.py's loop from a config, resumed bit-for-bit after a
kill, its metrics, and its bad input refused before anything compiles."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest

from orthros_jax.config import ModelConfig
from orthros_jax.rl import RLConfig, run, tasks
from orthros_jax.rl import loop as rl_loop
from orthros_jax.rl.config import GRPOConfig, RolloutConfig, TaskConfig
from orthros_jax.training import LoopConfig, OptimizerConfig

MODEL = ModelConfig(
    vocab_size=256, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, window=8
)
TIMING = {"rollout_s", "update_s", "rollout_tokens_per_s", "update_tokens_per_s"}


class AsciiPrompts:
    """A plug-in task for the test: a random model earns a reward from the start (the share of
    ASCII characters in its completion), so GRPO has a signal at once."""

    def __init__(self, cfg: TaskConfig, tok) -> None:
        self.inner = tasks.ArithmeticPrompts(cfg, tok)

    @property
    def reward(self):
        return lambda text, answer: sum(c.isascii() for c in text) / max(len(text), 1)

    def prompt(self, seed: int, stream: int, index: int) -> tasks.Prompt:
        return self.inner.prompt(seed, stream, index)


@pytest.fixture(autouse=True)
def _ascii_task(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "ascii", AsciiPrompts)


def _cfg(**train) -> RLConfig:
    return RLConfig(
        model=MODEL,
        task=TaskConfig(name="ascii", digits=1, eval_prompts=4),
        rollout=RolloutConfig(prompts=2, group_size=4, max_new_tokens=3, max_batch=8, max_len=32),
        grpo=GRPOConfig(rows=2, seq_len=64, out_len=12, kl_coef=0.05),
        optimizer=OptimizerConfig(lr=3e-3, warmup_steps=0, weight_decay=0.0),
        train=LoopConfig(
            steps=4,
            log_every=1,
            eval_every=2,
            checkpoint_every=2,
            async_checkpointing=False,
            progress_bar=False,
            **train,
        ),
    )


def _metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.mark.slow
def test_a_killed_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    cfg = _cfg()
    straight = run(cfg, str(tmp_path / "a"))
    step = rl_loop._Run.step

    def killed_at_3(self, state, ref, i):
        if i == 3:
            raise KeyboardInterrupt  # after the checkpoint at step 2, mid step 3
        return step(self, state, ref, i)

    monkeypatch.setattr(rl_loop._Run, "step", killed_at_3)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, str(tmp_path / "b"))
    monkeypatch.setattr(rl_loop._Run, "step", step)
    resumed = run(cfg, str(tmp_path / "b"))
    assert int(resumed.step) == int(straight.step) == 4
    jax.tree.map(
        lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
        straight.params,
        resumed.params,
    )
    a, b = _metrics(str(tmp_path / "a")), _metrics(str(tmp_path / "b"))
    assert a == b
    train = [r for r in a if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    for key in ("reward_mean", "reward_std", "kl", "clip_fraction", "completion_len"):
        assert all(np.isfinite(r[key]) for r in train), key
    assert any(r["kl"] > 0 for r in train[1:])  # the policy left the reference
    assert all(0 < r["reward_mean"] < 1 and r["reward_std"] > 0 for r in train)
    assert [r["step"] for r in a if r["split"] == "eval"] == [0, 2, 4]


def test_bad_settings_fail_before_compiling(tmp_path):
    with pytest.raises(ValueError, match="grad_accum_steps=2"):
        run(
            _cfg().__class__(
                **{**_cfg().__dict__, "optimizer": OptimizerConfig(grad_accum_steps=2)}
            ),
            str(tmp_path / "x"),
        )
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="vocab_size=128"):
        run(RLConfig(model=MODEL.replace(vocab_size=128)), str(tmp_path / "y"))
