"""Metrics sinks: a tqdm progress bar + console lines, TensorBoard events and metrics.jsonl.

Only process 0 writes (every process computes the same replicated scalars). Everything goes
under the workdir: workdir/tensorboard/ (tensorboardX event files) and workdir/metrics.jsonl
(one JSON object per log line; easy to plot or assert on).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

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


@dataclasses.dataclass
class _Sinks:
    """Process 0's sinks: TensorBoard's writer, metrics.jsonl and the progress bar."""

    writer: Any  # tensorboardX.SummaryWriter (imported only where it writes)
    jsonl: TextIO
    bar: tqdm.tqdm


class MetricsLogger:
    """Writes training scalars to every sink of process 0 (the others write nothing)."""

    def __init__(self, workdir: str, total_steps: int, initial_step: int, progress_bar: bool):
        self.sinks: _Sinks | None = None
        if jax.process_index() != 0:
            return
        from tensorboardX import SummaryWriter  # heavy import, only on the writing host

        path = os.path.join(workdir, METRICS_JSONL)
        drop_replayed(path, initial_step)
        self.sinks = _Sinks(
            writer=SummaryWriter(os.path.join(workdir, TENSORBOARD_DIR)),
            jsonl=open(path, "a"),  # noqa: SIM115
            bar=tqdm.tqdm(
                total=total_steps,
                initial=initial_step,
                disable=not progress_bar,
                unit="step",
                dynamic_ncols=True,
            ),
        )

    @property
    def enabled(self) -> bool:
        return self.sinks is not None

    def advance(self, steps: int) -> None:
        if self.sinks is not None:
            self.sinks.bar.update(steps)

    def write(self, step: int, prefix: str, values: Mapping[str, float]) -> None:
        """Scalars under "<prefix>/<name>" at an optimizer step, to every sink."""
        s = self.sinks
        if s is None:
            return
        for name, value in values.items():
            s.writer.add_scalar(f"{prefix}/{name}", value, step)
        s.writer.flush()
        s.jsonl.write(json.dumps({"step": step, "split": prefix, **values}) + "\n")
        s.jsonl.flush()
        text = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
        line = f"[{prefix}] step {step}: {text}"
        if not s.bar.disable and prefix == "train":
            s.bar.set_postfix({k: _fmt(v) for k, v in values.items() if k in ("loss", "lr")})
        console(line)

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.bar.close()
            self.sinks.writer.close()
            self.sinks.jsonl.close()


def drop_replayed(path: str, step: int) -> int:
    """Removes the records after `step` from a metrics.jsonl (a run killed after logging them
    resumes from an earlier checkpoint and logs those steps again). Returns how many went."""
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = f.readlines()
    keep = [line for line in lines if (n := _step_of(line)) is not None and n <= step]
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
