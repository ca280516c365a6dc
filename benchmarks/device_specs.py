"""Peak figures per accelerator kind, for the roofline of launch/compile.py (benchmarks/aot.py).

Each entry: dense bf16 matmul FLOP/s per chip, HBM bytes per chip, HBM bandwidth (bytes/s), and
the chip's inter-chip bandwidth (ICI / NVLink, bytes/s, all links one way), from the vendor's
own spec page (`source`). Keys are jax's `device_kind` strings of the abstract devices.
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
        "80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s bidirectional)",
    ),
}


def spec_of(device_kind: str) -> DeviceSpec:
    """The DeviceSpec of a jax device_kind; ValueError naming the known kinds."""
    if device_kind not in SPECS:
        raise ValueError(
            f"no peak figures for device kind {device_kind!r}; known: {', '.join(SPECS)} "
            "(benchmarks/device_specs.py)"
        )
    return SPECS[device_kind]
