"""One markdown table from several launch/compile.py records (docs/tpu-gpu.md's table of compiled
configs): target, mesh, remat / attention, peak vs HBM, roofline step time and MFU bound.

    python -m benchmarks.aot_table runs/aot/*/compile.json
"""

from __future__ import annotations

import json
import sys

from benchmarks.aot import _gib

HEADER = (
    "| program | target | mesh | remat / attention | peak / device (HBM) | fits | "
    "step >= (compute, memory, collectives) | MFU <= |\n|---|---|---|---|---|---|---|---|"
)


def row(rec: dict) -> str:
    s = rec["summary"]
    if rec["kind"] == "train":
        shape = f"{s['batch']} x {s['seq_len']}, accum {s['grad_accum_steps']}"
    elif rec["kind"] == "prefill":
        shape = f"{s['batch']} x {s['prompt_len']} tokens"
    else:
        shape = f"{s['batch']} row(s) at {s['max_len']}"
    program = f"{s['mode']} {s['params'] / 1e9:.1f}B {s['architecture']}, {shape}"
    mesh = ", ".join(f"{k}={v}" for k, v in s["mesh"].items() if v > 1) or "1 chip"
    hbm = _gib(rec["device"]["hbm_bytes"])
    if "bytes_per_device" not in rec:
        need = rec.get("oom_need_bytes")
        peak = (
            f"{rec.get('oom_what', '')} {_gib(need)} (> {_gib(rec['oom_available_bytes'])})"
            if need
            else "?"
        )
        return (
            f"| {program} | {rec['target']} | {mesh} | {s['remat']} / {s['attention_impl']} "
            f"| {peak} | no | - | - |"
        )
    r = rec["roofline_s"]
    times = (
        f"{r['step'] * 1e3:.1f} ms ({r['compute'] * 1e3:.1f}, {r['memory'] * 1e3:.1f}, "
        f"{r['collectives'] * 1e3:.1f})"
    )
    fits = "yes" if rec["fits"] else "no"
    peak = f"{_gib(rec['bytes_per_device']['peak'])} ({hbm})"
    return (
        f"| {program} | {rec['target']} | {mesh} | {s['remat']} / {s['attention_impl']} "
        f"| {peak} | {fits} | {times} | {rec['mfu_bound']:.0%} |"
    )


def table(records: list[dict]) -> str:
    return "\n".join([HEADER, *(row(r) for r in records)]) + "\n"


if __name__ == "__main__":
    recs = []
    for path in sys.argv[1:]:
        with open(path) as f:
            recs.append(json.load(f))
    print(table(recs), end="")
