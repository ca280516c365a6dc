"""Metrics sinks: a tqdm progress bar + console lines, TensorBoard events and metrics.jsonl.

Only process 0 writes (every process computes the same replicated scalars). Everything goes
under the workdir: workdir/tensorboard/ (tensorboardX event files) and workdir/metrics.jsonl
(one JSON object per log line; easy to plot or assert on).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping

import jax
import numpy as np
import tqdm

TENSORBOARD_DIR = "tensorboard"
METRICS_JSONL = "metrics.jsonl"


def console(message: str) -> None:
    """A status line on process 0's console (and in the log), tqdm-safe."""
    logging.info(message)
    if jax.process_index() == 0:
        tqdm.tqdm.write(message, file=sys.stdout)
        sys.stdout.flush()  # visible promptly when stdout is a file or pipe


class MetricsLogger:
    def __init__(self, workdir: str, total_steps: int, initial_step: int, progress_bar: bool):
        self.enabled = jax.process_index() == 0
        self.writer = None
        self.jsonl = None
        self.bar = None
        if not self.enabled:
            return
        from tensorboardX import SummaryWriter  # heavy import, only on the writing host

        self.writer = SummaryWriter(os.path.join(workdir, TENSORBOARD_DIR))
        path = os.path.join(workdir, METRICS_JSONL)
        drop_replayed(path, initial_step)
        self.jsonl = open(path, "a")  # noqa: SIM115
        self.bar = tqdm.tqdm(
            total=total_steps,
            initial=initial_step,
            disable=not progress_bar,
            unit="step",
            dynamic_ncols=True,
        )

    def advance(self, steps: int) -> None:
        if self.bar is not None:
            self.bar.update(steps)

    def write(self, step: int, prefix: str, values: Mapping[str, float]) -> None:
        """Scalars under "<prefix>/<name>" at an optimizer step, to every sink."""
        if not self.enabled:
            return
        for name, value in values.items():
            self.writer.add_scalar(f"{prefix}/{name}", value, step)
        self.writer.flush()
        self.jsonl.write(json.dumps({"step": step, "split": prefix, **values}) + "\n")
        self.jsonl.flush()
        text = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
        line = f"[{prefix}] step {step}: {text}"
        if not self.bar.disable and prefix == "train":
            self.bar.set_postfix({k: _fmt(v) for k, v in values.items() if k in ("loss", "lr")})
        console(line)

    def close(self) -> None:
        if self.enabled:
            self.bar.close()
            self.writer.close()
            self.jsonl.close()


def drop_replayed(path: str, step: int) -> int:
    """Removes the records after `step` from a metrics.jsonl (a run killed after logging them
    resumes from an earlier checkpoint and logs those steps again). Returns how many went."""
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = f.readlines()
    keep = [line for line in lines if _step_of(line) is not None and _step_of(line) <= step]
    if len(keep) != len(lines):
        with open(path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(path + ".tmp", path)
    return len(lines) - len(keep)


def _step_of(line: str) -> int | None:
    """A record's step; None for a line cut off by a kill mid-write."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def _fmt(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"


def moe_log_values(checked: list[dict]) -> dict[str, float]:
    """MoE metrics of the micro-batches since the last log line, averaged: moe_balance_loss,
    moe_z_loss and each expert's load share moe_load/<e> (none without MoE layers)."""
    if not checked or "moe_load" not in checked[0]:
        return {}
    mean = lambda k: np.mean([np.asarray(m[k], np.float64) for m in checked], axis=0)
    load = mean("moe_load")
    out = {k: float(mean(k)) for k in ("moe_balance_loss", "moe_z_loss")}
    return out | {f"moe_load/{e}": float(v) for e, v in enumerate(load)}
