"""launch/compile.py's records as markdown: one record's report (`markdown`, the compile.md of
each run) and one table from several (docs/tpu-gpu.md's table of compiled configs: target,
mesh, remat / attention, peak vs HBM, roofline step time and MFU bound).

    python -m benchmarks.aot_table runs/aot/*/compile.json
"""

from __future__ import annotations

import json
import sys
from typing import Any


def gib(x: float) -> str:
    """Bytes in GiB (MiB / KiB below one)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:.0f} B"


def markdown(rec: dict[str, Any], command: str = "") -> str:
    """The compile.json record as a markdown table (one row per figure)."""
    s, dev = rec["summary"], rec["device"]
    rows = [
        ("target", f"{rec.get('target', '?')}: {rec['devices']} x {dev['name']}"),
        ("program", f"{s['mode']}, {s['architecture']}, {s['params'] / 1e9:.2f}B params"),
        ("mesh", ", ".join(f"{k}={v}" for k, v in s["mesh"].items())),
        ("remat / attention", f"{s['remat']} / {s['attention_impl']}"),
        (
            "shape",
            ", ".join(
                f"{k}={s[k]}"
                for k in ("batch", "seq_len", "prompt_len", "max_len", "grad_accum_steps")
                if k in s
            ),
        ),
        ("device HBM", gib(dev["hbm_bytes"])),
    ]
    if "bytes_per_device" in rec:
        b = rec["bytes_per_device"]
        for k in ("argument", "output", "alias", "temp", "peak"):
            rows.append((f"{k} bytes / device", gib(b[k])))
        verdict = "fits" if rec["fits"] else "does not fit"
        rows.append(
            (
                "fits",
                f"{verdict} ({gib(abs(rec['headroom_bytes']))} "
                f"{'free' if rec['fits'] else 'over'})",
            )
        )
        c = rec["collective_bytes_per_device"]
        rows.append(
            (
                "collectives / device",
                ", ".join(f"{k} {gib(v)}" for k, v in c.items() if v) or "none",
            )
        )
        r = rec["roofline_s"]
        rows.append(
            (
                "FLOPs / step (analytic)",
                f"{rec['flops_per_step']:.3e} ({rec['flops_per_device']:.3e} / device)",
            )
        )
        rows.append(
            (
                "roofline (compute, memory, collectives)",
                f"{r['compute'] * 1e3:.2f}, {r['memory'] * 1e3:.2f}, "
                f"{r['collectives'] * 1e3:.2f} ms",
            )
        )
        rows.append(("step time >= / MFU <=", f"{r['step'] * 1e3:.2f} ms / {rec['mfu_bound']:.1%}"))
    else:
        need = rec.get("oom_need_bytes")
        what = (
            f"{rec.get('oom_what', 'program')} {gib(need)} > "
            f"{gib(rec['oom_available_bytes'])} available"
            if need
            else rec["error"]
        )
        rows.append(("fits", f"does not fit (compiler: {what})"))
    lines = ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    if command:
        lines.append(f"\n`{command}`")
    return "\n".join(lines) + "\n"


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
    hbm = gib(rec["device"]["hbm_bytes"])
    if "bytes_per_device" not in rec:
        need = rec.get("oom_need_bytes")
        peak = (
            f"{rec.get('oom_what', '')} {gib(need)} (> {gib(rec['oom_available_bytes'])})"
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
    peak = f"{gib(rec['bytes_per_device']['peak'])} ({hbm})"
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
