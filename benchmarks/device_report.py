"""The device check's summary (benchmarks/device_check.sh): prefill Orthros vs the Transformer
arm per prompt length, decode step times, the PT step's MFU at the chip's peak bf16 FLOP/s
(device_specs.py), and speculative / plain decode per arm (a round in plain steps and the
projection at the trained acceptance), from a launch/benchmark.py bench.json.

    python -m benchmarks.device_report OUT/bench/bench.json > OUT/summary.md
"""

from __future__ import annotations

import json
import sys

from benchmarks.common import ORTHROS, TRANSFORMER
from orthros_jax.parallel.device_specs import SPECS


def summary(bench: dict) -> str:
    """Markdown tables of a bench.json (suites prefill, decode, train where present)."""
    device = bench["device"]
    spec = SPECS.get(device)
    lines = [f"device: {device} ({bench['backend']}), jax {bench['jax']}, {bench['command']}", ""]
    if "prefill" in bench:
        lines += ["| T | orthros s | transformer s | transformer / orthros |", "|---|---|---|---|"]
        for r in bench["prefill"]:
            o = r[ORTHROS]["median_s"]
            t = r.get(TRANSFORMER, {}).get("median_s")
            ratio = f"{t / o:.2f}x" if t else "-"
            lines.append(f"| {r['T']} | {o:.4f} | {t if t is None else f'{t:.4f}'} | {ratio} |")
        lines.append("")
    if "decode" in bench:
        lines += ["| context | orthros ms/step | transformer ms/step |", "|---|---|---|"]
        for r in bench["decode"]:
            o, t = r[ORTHROS]["step_s"], r[TRANSFORMER]["step_s"]
            lines.append(f"| {r['context']} | {o * 1e3:.2f} | {t * 1e3:.2f} |")
        lines.append("")
    if "train" in bench:
        r = bench["train"]
        lines += [f"| PT step (T={r['T']}) | s | GFLOP | MFU |", "|---|---|---|---|"]
        for arm in (ORTHROS, TRANSFORMER):
            s, g = r[arm]["median_s"], r[arm]["gflop"]
            mfu = f"{g * 1e9 / s / spec.peak_bf16_flops:.1%}" if spec else "no peak for device"
            lines.append(f"| {arm} | {s:.4f} | {g:.1f} | {mfu} |")
        lines.append("")
    if "speculative" in bench:
        lines += [
            "| context | arm | k | plain tok/s | speculative tok/s | tokens / verify | "
            "round / step | measured ratio | projected ratio |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in bench["speculative"]:
            for arm in [a for a in (ORTHROS, TRANSFORMER) if a in r]:
                a = r[arm]
                lines.append(
                    f"| {r['context']} | {arm} | {r['k']} | {a['plain_tok_s']:.1f} | "
                    f"{a['spec_tok_s']:.1f} | {a['tokens_per_verify']:.2f} | "
                    f"{a['round_over_step']:.2f} | {a['measured_ratio']:.2f}x | "
                    f"{a['projected_ratio']:.2f}x at a = {a['acceptance']} (projection) |"
                )
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summary(json.load(f)), end="")
