"""What a user watches on a long run: throughput and model FLOPs utilisation per log line, and
a jax.profiler trace of chosen steps.

Throughput: tokens/s over the log window (compilation excluded), per device, and MFU = the
analytic model FLOPs of those tokens (layers/flops.py: forward + backward = 3 x forward, no
recompute counted) over the devices' dense matmul peak for the model's activation dtype
(parallel/device_specs.py). An unknown device kind (e.g. CPU) or dtype peak omits MFU, said
once on the console.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from orthros_jax.config import ModelConfig
from orthros_jax.layers.flops import train_step_flops
from orthros_jax.parallel.device_specs import peak_flops
from orthros_jax.training.metrics import console

PROFILE_DIR = "profile"


class Throughput:
    """Per-log-line throughput values for a fixed batch layout (PT or SFT)."""

    def __init__(self, cfg: ModelConfig, batch: Mapping[str, Any], devices: Sequence[Any]):
        rows, t = batch["tokens"].shape
        out_len = batch["targets"].shape[-1]
        self.flops_per_token = train_step_flops(cfg, rows, t, out_len) / (rows * t)
        self.n_devices = len(devices)
        kind = devices[0].device_kind
        self.peak = peak_flops(kind, cfg.dtype)
        if self.peak is None:
            console(
                f"MFU omitted: no peak FLOP/s known for device kind {kind!r} at dtype "
                f"{cfg.dtype} (orthros_jax/parallel/device_specs.py)"
            )

    def values(self, tokens_per_s: float) -> dict[str, float]:
        """tokens_per_s (all devices) -> tokens_per_s_per_device, model TFLOP/s per device,
        and mfu (a fraction of the peak) where the peak is known."""
        per_device = tokens_per_s / self.n_devices
        flops = per_device * self.flops_per_token
        out = {"tokens_per_s_per_device": per_device, "model_tflops_per_device": flops / 1e12}
        if self.peak is not None:
            out["mfu"] = flops / self.peak
        return out


class Profiler:
    """A jax.profiler trace of optimizer steps first..last (train.profile_steps) written to
    workdir/profile/ (TensorBoard's profile plugin / Perfetto read it). `before(update)` is
    called before the first micro-batch of each update, `after(update, state)` after its
    last one."""

    def __init__(self, steps: Sequence[int], workdir: str):
        self.first, self.last = (steps[0], steps[-1]) if steps else (0, -1)
        self.directory = os.path.join(workdir, PROFILE_DIR)
        self.active = False

    def before(self, update: int) -> None:
        if update == self.first and not self.active:
            jax.profiler.start_trace(self.directory)
            self.active = True

    def after(self, update: int, state: Any) -> None:
        if self.active and update >= self.last:
            jax.block_until_ready(state)  # the traced steps' device work, not just dispatch
            self.stop()
            console(f"profile of steps {self.first}-{self.last} written to {self.directory}")

    def stop(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False
