"""Peak figures per accelerator kind: the roofline of launch/compile.py (benchmarks/aot.py) and
the training loop's model FLOPs utilisation (training/throughput.py).

Each entry: dense bf16 matmul FLOP/s per chip, HBM bytes per chip, HBM bandwidth (bytes/s), the
chip's inter-chip bandwidth (ICI / NVLink, bytes/s, all links one way), and the dense float32
matmul FLOP/s where the vendor states one for what jax runs a float32 matmul as (NVIDIA: TF32
tensor cores, jax's default precision there; TPU pages give none: None), from the vendor's own
spec page (`source`). Keys are jax's `device_kind` strings.
"""

from __future__ import annotations

import dataclasses

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    name: str
    peak_bf16_flops: float
    hbm_bytes: int
    hbm_bandwidth: float
    interconnect_bandwidth: float
    source: str
    peak_fp32_flops: float | None = None


SPECS: dict[str, DeviceSpec] = {
    "TPU v4": DeviceSpec(
        "TPU v4",
        275e12,
        32 * GIB,
        1228e9,
        6 * 50e9,
        "https://cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2 at 1228 GB/s; "
        "6 ICI links)",
    ),
    "TPU v5 lite": DeviceSpec(
        "TPU v5e",
        197e12,
        16 * GIB,
        819e9,
        1600e9 / 8,
        "https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 16 GiB HBM2 at 819 GB/s, "
        "ICI 1600 Gbps)",
    ),
    "TPU v5": DeviceSpec(
        "TPU v5p",
        459e12,
        95 * GIB,
        2765e9,
        4800e9 / 8,
        "https://cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 95 GiB HBM2e at 2765 GB/s, "
        "ICI 4800 Gbps)",
    ),
    "TPU v6 lite": DeviceSpec(
        "TPU v6e",
        918e12,
        32 * GIB,
        1640e9,
        3584e9 / 8,
        "https://cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16, 32 GiB HBM at 1640 GB/s, "
        "ICI 3584 Gbps)",
    ),
    "NVIDIA H100 80GB HBM3": DeviceSpec(
        "H100 SXM",
        989.4e12,
        80 * 10**9,
        3.35e12,
        450e9,
        "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: 989.4 TFLOP/s dense bf16, "
        "494.7 dense TF32, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s bidirectional)",
        494.7e12,
    ),
    "NVIDIA H200": DeviceSpec(
        "H200 SXM",
        989.4e12,
        141 * 10**9,
        4.8e12,
        450e9,
        "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: 1979 TFLOP/s bf16 and 989 "
        "TF32 with sparsity, i.e. 989.4 / 494.7 dense; 141 GB HBM3e at 4.8 TB/s, NVLink 900 "
        "GB/s bidirectional)",
        494.7e12,
    ),
    "NVIDIA A100-SXM4-80GB": DeviceSpec(
        "A100 SXM 80GB",
        312e12,
        80 * 10**9,
        2039e9,
        300e9,
        "https://www.nvidia.com/en-us/data-center/a100/ (A100 SXM: 312 TFLOP/s dense bf16, 156 "
        "TF32, 80 GB HBM2e at 2039 GB/s, NVLink 600 GB/s bidirectional)",
        156e12,
    ),
    "NVIDIA A100-SXM4-40GB": DeviceSpec(
        "A100 SXM 40GB",
        312e12,
        40 * 10**9,
        1555e9,
        300e9,
        "https://www.nvidia.com/en-us/data-center/a100/ (A100 40GB SXM: 312 TFLOP/s dense "
        "bf16, 156 TF32, 40 GB HBM2 at 1555 GB/s, NVLink 600 GB/s bidirectional)",
        156e12,
    ),
}


def spec_of(device_kind: str) -> DeviceSpec:
    """The DeviceSpec of a jax device_kind; ValueError naming the known kinds."""
    if device_kind not in SPECS:
        raise ValueError(
            f"no peak figures for device kind {device_kind!r}; known: {', '.join(SPECS)} "
            "(orthros_jax/parallel/device_specs.py)"
        )
    return SPECS[device_kind]


def peak_flops(device_kind: str, dtype: str) -> float | None:
    """Dense matmul FLOP/s per chip of a jax device_kind for activations of `dtype`
    ("bfloat16"/"float16": the bf16 peak; "float32": the fp32 one), or None where unknown."""
    spec = SPECS.get(device_kind)
    if spec is None:
        return None
    return spec.peak_fp32_flops if dtype == "float32" else spec.peak_bf16_flops
