"""What a long run shows: tokens/s per device and MFU from the analytic FLOP model and the
device's peak (omitted, said once, where the peak is unknown), and train.profile_steps'
jax.profiler trace in the workdir."""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np
import pytest
from training_helpers import pt_dataset, tiny_model, tiny_train_config

from orthros_jax.layers.flops import train_step_flops
from orthros_jax.parallel.device_specs import SPECS, peak_flops
from orthros_jax.training import LoopConfig, train
from orthros_jax.training.monitor import Throughput


@dataclasses.dataclass
class _Device:
    device_kind: str


def _batch(rows: int, t: int, out_len: int) -> dict[str, np.ndarray]:
    return {"tokens": np.zeros((rows, t), np.int32), "targets": np.zeros((rows, out_len))}


def test_mfu_is_model_flops_over_the_devices_peak(capsys):
    cfg = tiny_model(dtype="bfloat16")
    devices = [_Device("TPU v5 lite")] * 4
    tp = Throughput(cfg, _batch(8, 32, 32), devices)
    values = tp.values(1e6)
    per_token = train_step_flops(cfg, 8, 32, 32) / (8 * 32)
    assert values["tokens_per_s_per_device"] == 2.5e5
    np.testing.assert_allclose(values["mfu"], 2.5e5 * per_token / 197e12, rtol=1e-12)
    np.testing.assert_allclose(values["model_tflops_per_device"], 2.5e5 * per_token / 1e12)
    # SFT: only the output copies' positions pay for the head (fewer FLOPs per token).
    sft = Throughput(cfg, _batch(8, 32, 8), devices).values(1e6)
    assert sft["mfu"] < values["mfu"]
    assert "MFU omitted" not in capsys.readouterr().out


def test_unknown_peak_omits_mfu_once(capsys):
    tp = Throughput(tiny_model(), _batch(2, 16, 16), [_Device("cpu")])
    assert "mfu" not in tp.values(100.0) and "mfu" not in tp.values(200.0)
    out = capsys.readouterr().out
    assert out.count("MFU omitted: no peak FLOP/s known for device kind 'cpu'") == 1
    # A TPU in float32: its pages state no fp32 matmul peak.
    assert peak_flops("TPU v5", "float32") is None and peak_flops("TPU v5", "bfloat16") == 459e12
    assert peak_flops("NVIDIA H200", "float32") == 494.7e12
    assert {"TPU v4", "TPU v5 lite", "TPU v5", "TPU v6 lite", "NVIDIA H100 80GB HBM3"} <= set(
        SPECS
    ) and any(k.startswith("NVIDIA A100") for k in SPECS)


@pytest.mark.slow
def test_profile_steps_write_a_trace_and_metrics_carry_throughput(tmp_path):
    cfg = tiny_train_config(n_layers=1, steps=4, log_every=2, profile_steps=(2, 3))
    workdir = str(tmp_path / "run")
    train(cfg, workdir, train_iterator=iter(pt_dataset(4, 16)), eval_batches=[])
    traces = glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*", "*.xplane.pb"))
    assert traces, os.listdir(workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    timed = [r for r in rows if r["split"] == "train" and "tokens_per_s" in r]
    assert timed and all(r["tokens_per_s_per_device"] == r["tokens_per_s"] for r in timed)
    assert all(r["model_tflops_per_device"] > 0 and "mfu" not in r for r in timed)  # CPU


@pytest.mark.parametrize("steps", [(0,), (3, 2), (1, 2, 3)])
def test_bad_profile_steps_are_refused(steps):
    with pytest.raises(ValueError, match="train.profile_steps"):
        LoopConfig(profile_steps=steps)
