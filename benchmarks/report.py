"""The benchmark's report (launch/benchmark.py): headline figures against their targets, and
bench.json, bench.md and bench.png written from one results dict. `targets_table` and `plot`
render the sequence and table4 suites' reports too."""

from __future__ import annotations

import json
import os
from typing import Any

from benchmarks.common import ORTHROS, TRANSFORMER

# The suites bench.md and bench.png report (sequence and table4 write reports of their own).
SUITES = ("prefill", "honesty", "memory", "decode", "train", "inference", "window")

# key -> (figure, target): docs/performance.md's first table, in its order.
TARGETS = {
    "speedup_fraction_of_ideal": ("Orthros prefill speedup / FLOP-ideal speedup at 16K", ">= 0.85"),
    "ours_over_dense": ("Transformer arm / dense dot_product_attention (<= 8K, worst)", "<= 1.0"),
    "orthros_over_floor": ("Orthros prefill / token-wise floor at 16K and 32K (worst)", "<= 1.2"),
    "scaling_32k_16k": ("Orthros prefill time(32K) / time(16K)", "<= 2.2"),
    "decode_ratio": ("decode step Orthros / Transformer at 16K context", "<= 1.15"),
    "temp_memory": ("compiled prefill temp memory at 32K / (cache + params)", "<= 0.25"),
    "train_ratio": ("PT step Orthros / Transformer at 2048, over the FLOP ratio", "<= 1.1"),
}


def targets_of(results: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """TARGETS with the figures named at the lengths that were measured (the train suite's T
    follows --config.train_len)."""
    out = dict(TARGETS)
    if "train" in results:
        name, target = out["train_ratio"]
        out["train_ratio"] = (name.replace("at 2048", f"at {results['train']['T']}"), target)
    return out


def _at(rows: list[dict], key: str, value: int) -> dict | None:
    return next((r for r in rows if r.get(key) == value), None)


def headline(results: dict[str, Any]) -> dict[str, float | None]:
    """The figures the targets are stated in (None where the suite or length did not run)."""
    out: dict[str, float | None] = dict.fromkeys(TARGETS)
    pre = results.get("prefill", [])
    r16, r32 = _at(pre, "T", 16384), _at(pre, "T", 32768)
    if r16 and "speedup_fraction_of_ideal" in r16:
        out["speedup_fraction_of_ideal"] = r16["speedup_fraction_of_ideal"]
    floors = [r["orthros_over_floor"] for r in (r16, r32) if r]
    out["orthros_over_floor"] = max(floors) if floors else None
    if r16 and r32:
        out["scaling_32k_16k"] = r32[ORTHROS]["median_s"] / r16[ORTHROS]["median_s"]
    hon = results.get("honesty", [])
    out["ours_over_dense"] = max(r["ours_over_dense"] for r in hon) if hon else None
    dec = _at(results.get("decode", []), "context", 16384)
    out["decode_ratio"] = dec["orthros_over_transformer"] if dec else None
    mem = _at(results.get("memory", []), "T", 32768)
    out["temp_memory"] = mem[ORTHROS].get("temp_over_resident") if mem else None
    if "train" in results:
        out["train_ratio"] = results["train"]["time_ratio_over_flop_ratio"]
    return out


def fmt(value: float | None, spec: str = ".3f") -> str:
    """A number of a report table, "—" where it was not measured."""
    return "—" if value is None else format(value, spec)


def targets_table(
    values: dict[str, float | None],
    targets: dict[str, tuple[str, str]],
    specs: dict[str, str] | None = None,
) -> list[str]:
    """The markdown "| figure | target | measured |" table: a row per key of `values` (a
    headline), named and targeted by `targets` (key -> (figure, target)), each value formatted
    with specs[key] (default ".3f")."""
    lines = ["| figure | target | measured |", "|---|---|---|"]
    for key, value in values.items():
        name, target = targets[key]
        lines.append(f"| {name} | {target} | {fmt(value, (specs or {}).get(key, '.3f'))} |")
    return lines


def _prefill_table(pre: list[dict]) -> list[str]:
    lines = [
        "| T | Orthros s | Transformer s | floor s | speedup | FLOP-ideal | Orthros/floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in pre:
        lines.append(
            f"| {r['T']} | {r[ORTHROS]['median_s']:.3f} | "
            f"{fmt(r.get(TRANSFORMER, {}).get('median_s'))} | {r['floor']['median_s']:.3f} | "
            f"{fmt(r.get('speedup'), '.2f')} | {fmt(r.get('flop_ideal_speedup'), '.2f')} | "
            f"{r['orthros_over_floor']:.3f} |"
        )
    return lines


def _inference_table(inf: dict) -> list[str]:
    lines = [
        f"Serving API, prompt {inf['prompt_len']} tokens, decode in a cache of "
        f"{inf['cache_slots']} slots, {inf['new_tokens']} tokens per timed run:",
        "",
        "| arm | TTFT s | decode_step tok/s (host round trip) | generate loop tok/s |",
        "|---|---|---|---|",
    ]
    for name in (ORTHROS, TRANSFORMER):
        r = inf[name]
        lines.append(
            f"| {name} | {r['ttft_s']:.3f} | {r['decode_step_tok_s']:.1f} | "
            f"{fmt(r['generate_tok_s'], '.1f')} |"
        )
    lines += ["", f"TTFT Transformer / Orthros: {inf['ttft_speedup']:.2f}"]
    return lines


def markdown(results: dict[str, Any]) -> str:
    """bench.md: the headline table, then one table per suite that ran."""
    lines = [
        f"Benchmark of {results['date']} on {results['backend']} ({results['device']}, "
        f"{results['cpu_count']} CPUs), jax {results['jax']}: `{results['command']}` "
        f"({results['wall_s']:.0f} s, XLA_FLAGS={results['xla_flags'] or '(none)'}). "
        f"Times are medians of {results['repeats']} rounds, each running every compared call "
        "once; a ratio is the median of its per-round ratios.",
        "",
        *targets_table(headline(results), targets_of(results)),
    ]
    if results.get("prefill"):
        lines += ["", *_prefill_table(results["prefill"])]
    if results.get("decode"):
        lines += ["", "| context | Orthros ms/step | Transformer ms/step | ratio |"]
        lines.append("|---|---|---|---|")
        for r in results["decode"]:
            lines.append(
                f"| {r['context']} | {1e3 * r[ORTHROS]['step_s']:.2f} | "
                f"{1e3 * r[TRANSFORMER]['step_s']:.2f} | {r['orthros_over_transformer']:.3f} |"
            )
    if results.get("inference"):
        lines += ["", *_inference_table(results["inference"])]
    if results.get("window"):
        lines += ["", "| window-attention query block | ms per chunk and layer |", "|---|---|"]
        lines += [f"| {r['block']} | {r['ms_per_chunk_layer']:.2f} |" for r in results["window"]]
    return "\n".join(lines) + "\n"


def plot(
    results: dict[str, Any],
    path: str,
    *,
    rows: list[dict[str, Any]] | None = None,
    styles: dict[str, str] | None = None,
    title: str = "Prefill",
) -> None:
    """Log-log prefill time against T, one line per arm in `styles` (default Orthros, the
    Transformer arm and the floor) over `rows` (default results["prefill"]), each row
    {"T", arm: {"median_s"}}; the other suites' plots (sequence, table4) call it too."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    rows = results.get("prefill", []) if rows is None else rows
    styles = styles or {ORTHROS: "o-", TRANSFORMER: "s-", "floor": "^--"}
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for name, style in styles.items():
        pts = [(r["T"], r[name]["median_s"]) for r in rows if name in r]
        if pts:
            ax.loglog(*zip(*pts, strict=True), style, label=name, base=2)
    ax.set_xlabel("prompt length T (tokens)")
    ax.set_ylabel("prefill time (s, median)")
    ax.set_title(f"{title}, {results['backend']} ({results['date']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(results: dict[str, Any], out_dir: str) -> list[str]:
    """Writes bench.json (every number) into out_dir, and, when one of SUITES ran, first adds
    results["headline"] and writes bench.md, and bench.png when there are prefill times to
    plot (--suites=memory alone has none). Returns the names written."""
    written = ["bench.json"]
    if any(name in results for name in SUITES):
        results["headline"] = headline(results)
        with open(os.path.join(out_dir, "bench.md"), "w") as f:
            f.write(markdown(results))
        written.append("bench.md")
        if results.get("prefill"):
            plot(results, os.path.join(out_dir, "bench.png"))
            written.append("bench.png")
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump(results, f, indent=2)
    return written
