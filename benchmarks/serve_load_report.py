"""serve_load.md / .png from serve_load.py's results (docs/inference-and-serving.md's tables)."""

from __future__ import annotations

import os
from typing import Any


def _f(x: Any, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def table4_md(t4: dict, pairs: list[tuple[str, str]]) -> list[str]:
    lines = [
        "| in/out | arm | TTFT s | E2E s | output tok/s | decode tok/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key, row in t4["rows"].items():
        for single, two in pairs:
            for arm in (single, two):
                r = row[arm]
                lines.append(
                    f"| {key} | {arm} | {_f(r['ttft_s'])} | {_f(r['e2e_s'])} | "
                    f"{_f(r['output_tok_s'], 1)} | {_f(r['decode_tok_s'], 1)} |"
                )
    lines += [
        "",
        "| T | pair | TTFT speedup (server) | prefill speedup (benchmark) | server / benchmark |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in t4["ttft"]:
        for single, two in pairs:
            x = row[f"{single}_over_{two}"]
            lines.append(
                f"| {row['T']} | {single}/{two} | {_f(x['ttft_speedup'], 2)} | "
                f"{_f(x['prefill_speedup'], 2)} | {_f(x['ttft_vs_prefill'], 2)} |"
            )
    return lines


def concurrency_md(rows: list[dict]) -> list[str]:
    lines = [
        "| clients | engine tok/s | server tok/s | generate tok/s "
        "| engine / generate | server / generate "
        "| engine TTFT s | server TTFT s | generate prefill s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        e, s, g = r["engine"], r["server"], r["generate"]
        lines.append(
            f"| {r['clients']} | {_f(e['output_tok_s'], 1)} | {_f(s['output_tok_s'], 1)} | "
            f"{_f(g['output_tok_s'], 1)} | {_f(r['engine_over_generate_tok_s'], 3)} | "
            f"{_f(r['server_over_generate_tok_s'], 3)} | {_f(e['ttft_s'])} | {_f(s['ttft_s'])} | "
            f"{_f(g['ttft_s'])} |"
        )
    return lines


def write_report(res: dict, out: str, pairs: list[tuple[str, str]]) -> None:
    lines = [
        f"# Serving benchmark ({res['backend']}, {res['date']})",
        "",
        f"Command: `{res['command']}`; "
        f"load average {res['load_before']:.1f} before, {res['load_after']:.1f} after; "
        f"{res['wall_s']:.0f} s.",
        "",
    ]
    if res["table4"]:
        lines += [
            "## Table 4 through the server (two concurrent requests)",
            "",
            *table4_md(res["table4"], pairs),
            "",
        ]
    if res["concurrency"]:
        lines += [
            "## Throughput and TTFT against concurrency (Orthros)",
            "",
            *concurrency_md(res["concurrency"]),
            "",
        ]
    with open(os.path.join(out, "serve_load.md"), "w") as f:
        f.write("\n".join(lines))
    if res["concurrency"]:
        _plot(res["concurrency"], os.path.join(out, "serve_load.png"))


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["clients"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(n, [r["engine"]["output_tok_s"] for r in rows], "o-", label="engine")
    a.plot(n, [r["server"]["output_tok_s"] for r in rows], "^-", label="engine through HTTP")
    a.plot(n, [r["generate"]["output_tok_s"] for r in rows], "s--", label="generate per batch")
    a.set(xscale="log", xlabel="concurrent clients", ylabel="output tokens/s", title="Throughput")
    a.set_xticks(n, [str(x) for x in n])
    b.plot(n, [r["engine"]["ttft_s"] for r in rows], "o-", label="engine TTFT (mean)")
    b.plot(n, [r["server"]["ttft_s"] for r in rows], "^-", label="through HTTP")
    b.plot(
        n, [r["generate"]["ttft_s"] for r in rows], "s--", label="generate: prefill of the batch"
    )
    b.set(xscale="log", xlabel="concurrent clients", ylabel="seconds", title="Time to first token")
    b.set_xticks(n, [str(x) for x in n])
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
