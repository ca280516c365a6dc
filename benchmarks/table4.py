"""Benchmark suite `table4`: the paper's Table 4 pairs side by side in one run — prefill time
against T and decode step time for Linear Hybrid vs Orthros-H and Transformer vs Orthros, at
the bench shape, through the public prefill / decode_step.

    python launch/benchmark.py --config=configs/bench_hybrid.py --suites=table4 \
        --out=docs/bench/table4

The arms are the bench model with `table4_n_layers` layers (two cycles: with one, the only
attention layer would be the last, whose base output prefill skips); the hybrid arms have the
`layer_types` cycle (gdn, gdn, gdn, attention) and the GDN dims of config.gdn; Orthros-H
shares every weight with the hybrid (plus its SO), as Orthros does with the Transformer. Every
call of a length is timed interleaved with the other arms' (benchmarking.time_interleaved):
only ratios from one run mean anything on a shared box.
launch/benchmark.py writes table4.md and table4.png next to bench.json (which holds every
number, under "table4").
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax

from benchmarks import common as bench
from benchmarks import report as bench_report
from benchmarks.common import HYBRID, ORTHROS, ORTHROS_H, TRANSFORMER
from orthros_jax.config import ModelConfig
from orthros_jax.config.architectures import ARCHITECTURES
from orthros_jax.layers import flops, gdn, gla, retention
from orthros_jax.model import init_params

PAIRS = ((HYBRID, ORTHROS_H), (TRANSFORMER, ORTHROS))


def table4_arms(c: Any) -> dict[str, ModelConfig]:
    """The four arms from the bench config (bf16 on accelerators)."""
    model = dict(c.model) | {"scale_offset": None, "n_layers": c.table4_n_layers}
    dims = {"kinds": {gdn.KIND.name: dict(c.gdn)}}
    return bench.model_configs(
        model,
        {
            TRANSFORMER: {"architecture": TRANSFORMER},
            ORTHROS: {"architecture": ORTHROS},
            HYBRID: dims | {"architecture": HYBRID},
            ORTHROS_H: dims | {"architecture": ORTHROS_H},
        },
    )


def layer_arms(c: Any) -> dict[str, ModelConfig]:
    """The pure recurrent stacks of c.table4_layer_arms (gdn / gla / retnet), the Transformer's
    shape with every layer of the arm's kind: a decode step ratio to the Transformer is one
    layer's."""
    model = dict(c.model) | {"scale_offset": None, "n_layers": c.table4_n_layers}
    # The config's section of each kind's options (c.gdn / c.gla / c.ret).
    section = {gdn.KIND.name: c.gdn, gla.KIND.name: c.gla, retention.KIND.name: c.ret}
    arms = {}
    for a in c.table4_layer_arms:
        (kind,) = ARCHITECTURES[a].kinds
        arms[a] = {"architecture": a, "layer_types": None, "kinds": {kind: dict(section[kind])}}
    return bench.model_configs(model, arms)


def table4_params(cfgs: dict[str, ModelConfig], seed: int) -> dict[str, dict]:
    """Shared weights per pair: the single-stream arm is its two-stream partner minus SO; any
    other arm its own."""
    out = {}
    for single, two in (pair for pair in PAIRS if pair[1] in cfgs):
        out[two] = init_params(cfgs[two], jax.random.PRNGKey(seed))
        out[single] = bench.drop_so(out[two], cfgs[two])
    for name, cfg in cfgs.items():
        if name not in out:
            out[name] = init_params(cfg, jax.random.PRNGKey(seed))
    return out


def table4_suite(c: Any, cfgs: Any, params: Any, results: dict[str, Any]) -> None:
    """Adds results["table4"] = {"prefill": rows per T, "decode": rows per context, "models"}.
    A suite of launch/benchmark.py: its arms are its own (table4_arms), not `cfgs` / `params`."""
    del cfgs, params
    cfgs = table4_arms(c)
    params = table4_params(cfgs, c.seed)
    pre = []
    for t in c.table4_lengths:
        # A fresh cache per call: the GDN state of a reused one would carry over.
        calls = {
            n: bench.prefill_call(cfg, params[n], t, c, fresh_cache=True) for n, cfg in cfgs.items()
        }
        row: dict[str, Any] = {"T": t, **bench.time_interleaved(calls, c.repeats)}
        for name, cfg in cfgs.items():
            row[name]["gflop"] = flops.prefill_flops(cfg, t) / 1e9
        for single, two in PAIRS:
            row[f"{single}_over_{two}"] = bench.ratio(row[single], row[two])
        pre.append(row)
        print(f"table4 prefill T={t}: " + json.dumps(_brief(row)), flush=True)
    layers = layer_arms(c)
    params = {**params, **table4_params(layers, c.seed)}
    dec = []
    for ctx in c.table4_contexts:
        row = bench.decode_row(cfgs | layers, params, ctx, c)
        for single, two in PAIRS:
            row[f"{single}_over_{two}"] = bench.ratio(row[single], row[two])
        for name in layers:  # > 1: the recurrent layer's decode step is slower
            row[f"{name}_over_{TRANSFORMER}"] = bench.ratio(row[name], row[TRANSFORMER])
        dec.append(row)
        print(f"table4 decode ctx={ctx}: " + json.dumps(_brief(row)), flush=True)
    results["table4"] = {
        "prefill": pre,
        "decode": dec,
        "models": {n: c.to_dict() for n, c in (cfgs | layers).items()},
    }


def _brief(row: dict) -> dict:
    return {
        k: (v.get("median_s", v.get("step_s")) if isinstance(v, dict) else v)
        for k, v in row.items()
    }


def markdown(results: dict[str, Any]) -> str:
    """The Table 4-style table: prefill seconds per T and decode ms per step, each pair's
    single-stream / two-stream time ratio (> 1: the Orthros arm is faster)."""
    tab = results["table4"]
    lines = [
        f"# Table 4: Linear Hybrid vs Orthros-H, Transformer vs Orthros ({results['backend']}, "
        f"{results['date']})",
        "",
        f"Command: `{results['command']}`; batch {results['batch_size']}, median of "
        f"{results['repeats']} interleaved rounds.",
        "",
        _header("prefill T", "s"),
    ]
    lines += [_cells(r["T"], r, "median_s", 1, ".3f") for r in tab["prefill"]]
    lines += ["", _header("decode context", "ms")]
    lines += [_cells(r["context"], r, "step_s", 1e3, ".2f") for r in tab["decode"]]
    over = f"_over_{TRANSFORMER}"  # the layer arms' keys (table4_suite)
    names = [k.removesuffix(over) for k in tab["decode"][0] if k.endswith(over)]
    if names:
        lines += [
            "",
            "Decode step per layer: pure stacks of each kind vs the Transformer (same layers).",
            "",
            f"| decode context | {TRANSFORMER} ms | "
            + " | ".join(f"{n} ms | {n}/{TRANSFORMER}" for n in names)
            + " |",
            "|---:|---:|" + "---:|---:|" * len(names),
        ]
        for r in tab["decode"]:
            cells = [f"{1e3 * r[n]['step_s']:.2f} | {r[n + over]:.2f}" for n in names]
            lines.append(
                f"| {r['context']} | {1e3 * r[TRANSFORMER]['step_s']:.2f} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


def _header(first: str, unit: str) -> str:
    """The header and alignment rows of a table of the pairs (PAIRS): each arm's time in `unit`
    and the pair's ratio."""
    cols = " | ".join(f"{a} {unit} | {b} {unit} | {a}/{b}" for a, b in PAIRS)
    return f"| {first} | {cols} |\n|---:|" + "---:|---:|---:|" * len(PAIRS)


def _cells(first: Any, r: dict[str, Any], key: str, scale: float, spec: str) -> str:
    """A row of the pairs' table: each arm's r[arm][key] * scale and the pair's ratio."""
    cells = " | ".join(
        f"{scale * r[a][key]:{spec}} | {scale * r[b][key]:{spec}} | {r[f'{a}_over_{b}']:.2f}"
        for a, b in PAIRS
    )
    return f"| {first} | {cells} |"


def plot(results: dict[str, Any], path: str) -> None:
    """Log-log prefill time against T for the four arms."""
    styles = {HYBRID: "s-", ORTHROS_H: "o-", TRANSFORMER: "s--", ORTHROS: "o--"}
    rows = results["table4"]["prefill"]
    bench_report.plot(results, path, rows=rows, styles=styles, title="Table 4 pairs, prefill")


def write_report(results: dict[str, Any], out_dir: str) -> list[str]:
    """table4.md and table4.png into out_dir (bench.json holds every number); returns their
    names."""
    with open(os.path.join(out_dir, "table4.md"), "w") as f:
        f.write(markdown(results))
    plot(results, os.path.join(out_dir, "table4.png"))
    return ["table4.md", "table4.png"]
