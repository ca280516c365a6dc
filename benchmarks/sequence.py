"""The benchmark's 'sequence' suite (launch/benchmark.py --suites=sequence): sequence-parallel
prefill over the `sequence_devices` devices of one mesh axis, through the public API
(init_cache(mesh=), prefill). Figures, each against the issue's target:
  scaling       Orthros prefill 64K -> 1M tokens: time per doubling (<= 2.2) and the compiled
                per-device peak memory over (cache shard + params) (<= 1.3);
  collectives   bytes per device of one layer's collectives in the compiled 1M prefill:
                Orthros's halo vs the Transformer arm's all-gather (<= 1 %);
  transformer   Orthros vs the Transformer arm, both sequence-parallel, where the quadratic
                arm runs in reasonable time;
  single        sequence-parallel vs one-device Orthros prefill: same logits, time (<= 1.5).
Simulated CPU devices share the host's cores, so this measures scaling, memory and overhead,
not speedup; on 8 accelerators the same command measures the real thing.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import common as bench
from benchmarks import report as bench_report
from benchmarks.common import ORTHROS, TRANSFORMER
from benchmarks.hlo_stats import collective_bytes
from orthros_jax.inference import init_cache, sequence_parallel
from orthros_jax.inference.cache import cache_shardings
from orthros_jax.parallel import mesh as pmesh

TARGETS = {
    "doubling": ("Orthros SP prefill wall time per doubling, 64K -> 1M (worst)", "<= 2.2"),
    "doubling_cpu": ("the same in host CPU time (less sensitive to a shared machine)", "<= 2.2"),
    "memory": ("per-device peak memory / (cache shard + params) at the longest T", "<= 1.3"),
    "memory_worst": ("the same, worst over 64K -> 1M", "<= 1.3"),
    "collectives": ("collective bytes per layer at 1M, Orthros / Transformer", "<= 0.01"),
    "single": ("SP / single-device Orthros prefill wall time at 128K", "<= 1.5"),
    "single_cpu": ("the same in host CPU time", "<= 1.5"),
}


def _prefill_call(cfg, params, t: int, c, mesh) -> tuple[Any, dict]:
    """benchmarking.prefill_call of a full t-token prompt into a t-slot cache split over `mesh`
    (or on one device if None), waiting for its result; state["logits"] holds its last logits,
    state["cpu_s"] the host CPU seconds of every call."""
    prefill_once = bench.prefill_call(cfg, params, t, c, mesh=mesh)
    state: dict[str, Any] = {"cpu_s": []}

    def call():
        start = time.process_time()
        logits = jax.block_until_ready(prefill_once())
        state["cpu_s"].append(time.process_time() - start)
        state["logits"] = logits
        return logits

    return call, state


def _compiled(cfg, params, t: int, c, mesh):
    """The compiled sequence-parallel prefill of a t-slot cache (shapes only: nothing runs)."""
    shape = jax.eval_shape(lambda: init_cache(cfg, c.batch_size, t))
    shardings = cache_shardings(cfg, c.batch_size, t, mesh)
    cache = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shape, shardings
    )
    _, rows = sequence_parallel.specs(cfg, mesh, c.batch_size, t)
    sds = lambda shape, spec: jax.ShapeDtypeStruct(
        shape, jnp.int32, sharding=NamedSharding(mesh, spec)
    )
    tokens, lengths = (
        sds((c.batch_size, t), P(rows, sequence_parallel.SEQ)),
        sds((c.batch_size,), P(rows)),
    )
    return sequence_parallel.prefill.lower(
        params, cache, tokens, lengths, cfg=cfg, mesh=mesh
    ).compile()


def _memory(cfg, params, t: int, c, mesh) -> dict[str, Any]:
    """Per-device compiled memory of the sequence-parallel prefill, and its resident part."""
    stats = _compiled(cfg, params, t, c, mesh).memory_analysis()
    n = sequence_parallel.sequence_size(mesh)
    cache_shard = bench.tree_bytes(jax.eval_shape(lambda: init_cache(cfg, c.batch_size, t))) // n
    resident = cache_shard + bench.tree_bytes(params)
    fields = ("argument", "output", "alias", "temp")
    row = {f"{f}_bytes": int(getattr(stats, f"{f}_size_in_bytes")) for f in fields}
    # Everything live at once, the donated cache counted once. (XLA:CPU's own
    # peak_memory_in_bytes, kept for reference, leaves the temporaries out.)
    row["peak_bytes"] = (
        row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"] + row["temp_bytes"]
    )
    row["reported_peak_bytes"] = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
    row["cache_shard_plus_params_bytes"] = resident
    row["peak_over_resident"] = row["peak_bytes"] / resident
    return row


def _place(params, mesh):
    return jax.device_put(params, NamedSharding(mesh, P()))


def sequence_suite(c, cfgs, params, results) -> None:
    """Runs the four figures of the module docstring into results["sequence"]."""
    n = c.sequence_devices
    if jax.device_count() < n:
        raise ValueError(
            f"the sequence suite needs {n} devices, found {jax.device_count()}; on CPU run with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n}"
        )
    mesh = pmesh.sequence_mesh(n, devices=jax.devices()[:n])
    on_mesh = {name: _place(p, mesh) for name, p in params.items()}
    orthros = cfgs[ORTHROS]
    out: dict[str, Any] = {"devices": n, "device_kind": jax.devices()[0].device_kind}

    rows = []
    for t in c.sequence_lengths:
        call, state = _prefill_call(orthros, on_mesh[ORTHROS], t, c, mesh)
        row = {"T": t, **bench.time_interleaved({ORTHROS: call}, c.sequence_repeats)}
        _add_cpu(row[ORTHROS], state)
        del call, state  # frees this length's cache before the next one
        row["memory"] = _memory(orthros, on_mesh[ORTHROS], t, c, mesh)
        rows.append(row)
        print(
            f"sequence T={t}: {row[ORTHROS]['median_s']:.2f} s, peak/resident "
            f"{row['memory']['peak_over_resident']:.3f}",
            flush=True,
        )
    for a, b in zip(rows, rows[1:], strict=False):
        b["time_over_previous"] = b[ORTHROS]["median_s"] / a[ORTHROS]["median_s"]
        b["cpu_over_previous"] = b[ORTHROS]["cpu_median_s"] / a[ORTHROS]["cpu_median_s"]
    out["scaling"] = rows

    t = max(c.sequence_lengths)
    coll = {"T": t}
    for name, cfg in cfgs.items():
        coll[name] = collective_bytes(_compiled(cfg, on_mesh[name], t, c, mesh))
    k_v = (
        2 * c.batch_size * orthros.n_kv_heads * orthros.head_dim * jnp.dtype(orthros.dtype).itemsize
    )
    coll["orthros_halo_expected"] = k_v * (orthros.window - 1)
    coll["transformer_gather_expected"] = k_v * t
    totals = {name: sum(coll[name].values()) for name in cfgs}
    coll["orthros_over_transformer"] = totals[ORTHROS] / totals[TRANSFORMER]
    out["collectives"] = coll
    print("sequence collectives: " + json.dumps(coll), flush=True)

    rows = []
    for t in c.sequence_transformer_lengths:
        calls = {
            name: _prefill_call(cfg, on_mesh[name], t, c, mesh)[0] for name, cfg in cfgs.items()
        }
        row = {"T": t, **bench.time_interleaved(calls, c.sequence_repeats)}
        row["transformer_over_orthros"] = bench.ratio(row[TRANSFORMER], row[ORTHROS])
        rows.append(row)
        print(f"sequence vs transformer T={t}: {row['transformer_over_orthros']:.2f}", flush=True)
    out[TRANSFORMER] = rows

    t = c.sequence_single_len
    sp_call, sp_state = _prefill_call(orthros, on_mesh[ORTHROS], t, c, mesh)
    one_call, one_state = _prefill_call(orthros, params[ORTHROS], t, c, None)
    row = {"T": t, **bench.time_interleaved({"sp": sp_call, "single": one_call}, c.repeats)}
    row["sp_over_single"] = bench.ratio(row["sp"], row["single"])
    _add_cpu(row["sp"], sp_state)
    _add_cpu(row["single"], one_state)
    row["sp_over_single_cpu"] = row["sp"]["cpu_median_s"] / row["single"]["cpu_median_s"]
    diff = np.asarray(sp_state["logits"]) - np.asarray(one_state["logits"])
    row["max_abs_logit_diff"] = float(np.abs(diff).max())
    out["single"] = row
    print(
        f"sequence vs single device T={t}: {row['sp_over_single']:.3f}, logits "
        f"{row['max_abs_logit_diff']:.2e}",
        flush=True,
    )
    out["headline"] = headline(out)
    results["sequence"] = out


def _add_cpu(timing: dict, state: dict) -> None:
    """Host CPU seconds of the timed calls (the first, the warm-up, compiled) into a timing."""
    timing["cpu_s"] = state["cpu_s"][1:]
    timing["cpu_median_s"] = statistics.median(timing["cpu_s"])


def headline(seq: dict[str, Any]) -> dict[str, float | None]:
    """The figures TARGETS names, from results["sequence"]."""
    scaling = seq.get("scaling", [])
    worst = lambda key: max((r[key] for r in scaling if key in r), default=None)
    memory = [r["memory"]["peak_over_resident"] for r in scaling]
    single = seq.get("single", {})
    return {
        "doubling": worst("time_over_previous"),
        "doubling_cpu": worst("cpu_over_previous"),
        "memory": memory[-1] if memory else None,
        "memory_worst": max(memory, default=None),
        "collectives": seq.get("collectives", {}).get("orthros_over_transformer"),
        "single": single.get("sp_over_single"),
        "single_cpu": single.get("sp_over_single_cpu"),
    }


def markdown(results: dict[str, Any]) -> str:
    """sequence.md: the headline against the targets, then one table per figure."""
    seq = results["sequence"]
    fmt = bench_report.fmt
    lines = [
        f"Sequence-parallel prefill, {results['date']}, {seq['devices']} x {seq['device_kind']} "
        f"({results['backend']}, {results['cpu_count']} host CPUs), jax {results['jax']}: "
        f"`{results['command']}` ({results['wall_s']:.0f} s). Times are medians of the timed "
        "rounds after a warm-up; ratios of interleaved calls are medians of per-round ratios.",
        "",
        *bench_report.targets_table(seq["headline"], TARGETS, {"collectives": ".2e"}),
    ]
    lines += [
        "",
        "| T | Orthros SP s | time / previous | host CPU s | CPU / previous | "
        "peak MB/device | cache shard + params MB | peak / resident |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in seq["scaling"]:
        m, o = r["memory"], r[ORTHROS]
        lines.append(
            f"| {r['T']} | {o['median_s']:.2f} | {fmt(r.get('time_over_previous'))} | "
            f"{fmt(o.get('cpu_median_s'), '.2f')} | {fmt(r.get('cpu_over_previous'))} | "
            f"{m['peak_bytes'] / 2**20:.1f} | {m['cache_shard_plus_params_bytes'] / 2**20:.1f} | "
            f"{m['peak_over_resident']:.3f} |"
        )
    coll = seq["collectives"]
    lines += [
        "",
        f"Collective bytes per device at T={coll['T']} (one layer's, as compiled):",
        "",
        "| arm | " + " | ".join(coll[ORTHROS]) + " |",
        "|---|" + "---|" * len(coll[ORTHROS]),
    ]
    for name in (ORTHROS, TRANSFORMER):
        lines.append(f"| {name} | " + " | ".join(str(v) for v in coll[name].values()) + " |")
    lines += [
        "",
        "| T | Orthros SP s | Transformer SP s | Transformer / Orthros |",
        "|---|---|---|---|",
    ]
    for r in seq[TRANSFORMER]:
        lines.append(
            f"| {r['T']} | {r[ORTHROS]['median_s']:.2f} | {r[TRANSFORMER]['median_s']:.2f} | "
            f"{r['transformer_over_orthros']:.2f} |"
        )
    s = seq["single"]
    lines += [
        "",
        f"At T={s['T']}: SP {s['sp']['median_s']:.2f} s, one device "
        f"{s['single']['median_s']:.2f} s, ratio {s['sp_over_single']:.3f} (host CPU "
        f"{fmt(s.get('sp_over_single_cpu'))}); max |logit difference| "
        f"{s['max_abs_logit_diff']:.2e}.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str) -> None:
    """Log-log prefill time against T (bench_report.plot): Orthros sequence-parallel from the
    scaling and comparison rows, the Transformer arm where it ran."""
    seq = results["sequence"]
    rows = sorted(seq["scaling"] + seq[TRANSFORMER], key=lambda r: r["T"])
    bench_report.plot(results, path, rows=rows, title="Sequence-parallel prefill")


def write_report(results: dict[str, Any], out_dir: str) -> list[str]:
    """sequence.md and sequence.png into out_dir (bench.json holds every number); returns their
    names."""
    with open(os.path.join(out_dir, "sequence.md"), "w") as f:
        f.write(markdown(results))
    plot(results, os.path.join(out_dir, "sequence.png"))
    return ["sequence.md", "sequence.png"]
