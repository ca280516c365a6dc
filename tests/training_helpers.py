"""Shared pieces of the training tests: a tiny model, synthetic PT batches, tiny run configs."""

from __future__ import annotations

import os
import subprocess
import sys

import grain
import numpy as np
from helpers import tiny_config

from orthros_jax.config import ModelConfig
from orthros_jax.training import LoopConfig, MeshConfig, OptimizerConfig, TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_model(**changes) -> ModelConfig:
    """The tests' tiny config (helpers.TINY: window 8 < T, a real two-stream Orthros) with
    16-token attention blocks."""
    return tiny_config(**({"attention_block_q": 16, "attention_block_k": 16} | changes))


def pt_batch(seed: int, batch: int = 8, seq: int = 32) -> dict[str, np.ndarray]:
    """A packed PT batch: each row holds two documents (positions restart, segment ids 1/2);
    the last token of each document has no target (loss_mask 0)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, (batch, seq + 1), dtype=np.int32)
    cut = rng.integers(seq // 4, 3 * seq // 4, batch)
    idx = np.arange(seq)[None, :]
    first = idx < cut[:, None]
    segment_ids = np.where(first, 1, 2).astype(np.int32)
    positions = np.where(first, idx, idx - cut[:, None]).astype(np.int32)
    loss_mask = np.ones((batch, seq), np.float32)
    loss_mask[np.arange(batch), cut - 1] = 0.0  # the next token is in the other document
    return {
        "tokens": tokens[:, :seq],
        "positions": positions,
        "segment_ids": segment_ids,
        "targets": tokens[:, 1:],
        "loss_mask": loss_mask,
    }


def pt_dataset(batch: int = 8, seq: int = 32, poison_step: int | None = None) -> grain.IterDataset:
    """A checkpointable stream of synthetic PT batches (batch i from seed i); batch number
    `poison_step` has a NaN loss mask (to make that step's loss NaN)."""

    def make(i: int) -> dict[str, np.ndarray]:
        b = pt_batch(i, batch, seq)
        if i == poison_step:
            b["loss_mask"] = np.full_like(b["loss_mask"], np.nan)
        return b

    return grain.MapDataset.range(10**6).map(make).to_iter_dataset()


def tiny_train_config(n_layers: int = 2, **loop) -> TrainConfig:
    """A TrainConfig for caller-supplied iterators (data=None)."""
    loop_cfg = dict(
        steps=6,
        log_every=2,
        eval_every=0,
        eval_batches=1,
        checkpoint_every=2,
        keep_checkpoints=10,
        async_checkpointing=True,
        progress_bar=False,
    )
    return TrainConfig(
        model=tiny_model(n_layers=n_layers),
        data=None,
        optimizer=OptimizerConfig(lr=1e-2, warmup_steps=1, weight_decay=0.1),
        train=LoopConfig(**(loop_cfg | loop)),
        mesh=MeshConfig(data=1, fsdp=1, tensor=1),
    )


# Overrides that turn configs/tiny_pt.py into a seconds-long run (tiny model, short rows).
TINY_FLAGS = [
    "--config=configs/tiny_pt.py",
    "--config.model.d_model=32",
    "--config.model.n_layers=2",
    "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1",
    "--config.model.head_dim=16",
    "--config.model.d_ff=64",
    "--config.model.window=16",
    "--config.model.attention_block_q=32",
    "--config.model.attention_block_k=32",
    "--config.data.seq_len=64",
    "--config.data.batch_size=4",
    "--config.train.progress_bar=False",
    "--config.train.eval_batches=1",
]


def run_train(args: list[str], **kw) -> subprocess.CompletedProcess:
    """launch/train.py in a subprocess (cwd = repo root), output captured."""
    return subprocess.run(
        [sys.executable, "launch/train.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        **kw,
    )


def subprocess_env(devices: int) -> dict[str, str]:
    """The environment for a child that simulates `devices` CPU devices."""
    env = dict(os.environ)
    kept = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "tests")])
    return env


# The launcher runner of run_launchers: imports the heavy modules once, then forks one child
# per command line, which runs the script (or `-m` module) as __main__ with that argv, its
# stdout/stderr in files, and exits as the interpreter would (a SystemExit's string to stderr
# and status 1; an uncaught exception's traceback and status 1). A child saves its coverage data
# (where a coverage run measures this process) before it exits.
_LAUNCHER_RUNNER = r"""
import importlib, json, os, runpy, sys, traceback
spec = json.loads(sys.stdin.read())
for name in spec["preload"]:
    importlib.import_module(name)
results = []
for i, argv in enumerate(spec["runs"]):
    out, err = (os.path.join(spec["dir"], f"{i}.{s}") for s in ("out", "err"))
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            with open(out, "wb") as o, open(err, "wb") as e:
                os.dup2(o.fileno(), 1)
                os.dup2(e.fileno(), 2)
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            traceback.print_exc()
            code = 1
        if isinstance(code, str):
            print(code, file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        try:  # os._exit skips atexit: save what a coverage run measured here first
            from coverage import Coverage
            cov = Coverage.current()
        except ImportError:
            cov = None
        if cov is not None:
            cov.stop()
            cov.save()
        os._exit(code or 0)
    _, status = os.waitpid(pid, 0)
    results.append(os.waitstatus_to_exitcode(status))
print(json.dumps(results))
"""

# What the launchers import; a child that imports more pays for it itself.
PRELOAD = ("jax", "absl.app", "absl.flags", "orthros_jax.config.cli", "orthros_jax.training")


def run_launchers(
    runs: list[list[str]], tmp_path, *, env=None, preload=PRELOAD, timeout: int = 300
) -> list[subprocess.CompletedProcess]:
    """Each argv of `runs` (a script path and its arguments, or ["-m", module, ...]) as
    `python ARGV` in the repo root, in one subprocess that imports jax and the package once
    and forks a child per command line (each imports ~3.5 s otherwise). Returns one
    CompletedProcess per run: its exit status, stdout and stderr."""
    import json

    out = os.path.join(str(tmp_path), "launcher_runs")
    os.makedirs(out, exist_ok=True)
    spec = {"runs": runs, "dir": out, "preload": list(preload)}
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCHER_RUNNER],
        input=json.dumps(spec),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.splitlines()[-1])
    results = []
    for i, (argv, code) in enumerate(zip(runs, codes, strict=True)):
        with open(os.path.join(out, f"{i}.out")) as o, open(os.path.join(out, f"{i}.err")) as e:
            results.append(subprocess.CompletedProcess(argv, code, o.read(), e.read()))
    return results
