"""Self-speculative decoding compiled for an accelerator target (launch/compile.py with an
inference config of mode "speculative", e.g. configs/decode_8b.py:speculative): the plain decode
step, the draft step (drivers.decode with draft_window) and the verify pass of each k
(inference/spec_passes.py) as the target's compiler builds them, and the bytes each reads per
accepted token (docs/speculative.md "On accelerators, by compilation").

Bytes and FLOPs are XLA's cost analysis of compiled per-device programs: "bytes accessed",
every instruction's operand and output bytes. It counts a scanned loop body once, and an
unrolled 8B program at 128K takes minutes to compile here, so the counts come from the same
programs with 2 and 3 layers unrolled, extrapolated to the model's n layers: x(n) = x(2) +
(n - 2) (x(3) - x(2)) (every layer is the same program; the embedding and head are the rest;
a 1-layer program is not one layer less, XLA fuses it differently, and the count is linear
from 2 layers on). XLA's count charges a cache write (a scatter of one slot per row into a
layer's stack of every slot, done in place) with the whole stack, and a compiler may relayout
the whole cache around it (docs/tpu-gpu.md), so the counted programs return their logits only
(the write is dead code) and the bytes the write stores are added: one slot per row and
written token in every layer. The plain decode step as configured (n layers, scanned) is
compiled too, for its memory: whether the target holds it.

A round is k draft steps and one verify pass (a two-stream model's runs the last draft's base
stream too, writing its K/V: spec_passes.verify_folded; a single-stream arm's, MagicDec-style,
rewrites the k + 1 tokens' K/V); at a
tokens per verify (the acceptance measured on a trained model, inference.acceptance) it emits
a tokens, so

    bytes per accepted token = (drafts * draft + verify) / a,
    projected speedup = plain decode's bytes per token / that  (a projection: bytes, not time)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import aot, hlo_stats
from orthros_jax.config.cli import to_plain
from orthros_jax.inference import drivers, spec_passes
from orthros_jax.inference.speculative import Speculative, check
from orthros_jax.parallel import sharding
from orthros_jax.parallel.device_specs import DeviceSpec

PLAIN, DRAFT = "decode", "draft"
BASIS = (2, 3)  # the layer counts whose programs' costs are extrapolated


def verify_name(k: int) -> str:
    return f"verify_k{k}"


def is_speculative(config: Any) -> bool:
    return to_plain(config).get("inference", {}).get("mode") == "speculative"


def _check(inf: aot.InferenceConfig) -> tuple[tuple[int, ...], tuple[float, ...]]:
    ks, acc = tuple(inf.spec_ks), tuple(inf.acceptance)
    if not ks or len(ks) != len(acc):
        raise ValueError(
            f"inference.acceptance={acc} needs one value per k of inference.spec_ks={ks}"
        )
    for k, a in zip(ks, acc, strict=True):
        if not isinstance(k, int) or k < 1 or not 1 <= a <= k + 1:
            raise ValueError(
                f"inference.spec_ks / acceptance: k={k!r} must be an int >= 1 and its "
                f"acceptance {a!r} (tokens per verify) in [1, k + 1]"
            )
    if inf.draft_window < 0:
        raise ValueError(f"inference.draft_window must be >= 0, got {inf.draft_window}")
    return ks, acc


def speculative_programs(
    config: Any, devices: list[Any], reads: bool = False
) -> dict[str, aot.Program]:
    """The decode step, the draft step and one verify pass per k of a speculative inference
    config (reads: each returning its logits only, its cache write dead code); ValueError
    (before any compile) for a speculation this model, cache or mesh cannot run."""
    st = aot.inference_setup(config, devices)
    cfg, inf, mesh = st.cfg, st.inf, st.mesh
    ks, _ = _check(inf)
    window = inf.draft_window or cfg.window
    for k in ks:
        check(Speculative(k, window), cfg, inf.max_len, st.sequence)
    summary = st.summary() | {"draft_window": window, "two_streams": cfg.two_streams}

    progs: dict[str, aot.Program] = {}

    def add(name: str, fn: Any, args: tuple, writes: bool) -> None:
        """fn(params, cache, ...) -> (logits, cache) if it writes, else logits."""
        if writes and reads:
            fn, writes = (lambda f: lambda *a: f(*a)[0])(fn), False
        jitted = jax.jit(sharding.traced_under(fn, mesh), donate_argnums=(1,) if writes else ())
        progs[name] = aot.Program(jitted, args, mesh, name, None, summary | {"program": name})

    step = (st.params, st.cache, st.vec(jnp.int32), st.vec(jnp.bool_))
    add(PLAIN, lambda p, c, t, a: drivers.decode(p, c, t, a, cfg=cfg), step, True)
    draft = lambda p, c, t, a: drivers.decode(p, c, t, a, cfg=cfg, draft_window=window)
    add(DRAFT, draft, step, True)
    for k in ks:
        tokens, start = st.vec(jnp.int32, k + 1), st.vec(jnp.int32)
        if cfg.two_streams:  # the last draft's base stream, then the copies over the cache
            fn = lambda p, c, t, s, v: spec_passes.verify_folded(p, c, t, s, v, cfg=cfg)
            add(verify_name(k), fn, (st.params, st.cache, tokens, start, st.vec(jnp.bool_)), True)
        else:  # MagicDec-style: the k + 1 tokens through every layer, K/V rewritten
            fn = lambda p, c, t, s, v: spec_passes.verify_rewrite(p, c, t, s, v, cfg=cfg)
            args = (st.params, st.cache, tokens, start, st.vec(jnp.bool_, k + 1))
            add(verify_name(k), fn, args, True)
    return progs


def slot_bytes(cache: Any) -> float:
    """Per device: the bytes of one slot of every row in every layer's state (what a decode
    step's cache write stores), from the abstract cache's per-device leaf shapes [layers, B,
    ..., S, ...] (the slot axis is the one of length max_len)."""
    total = 0.0
    for a in jax.tree.leaves(cache.states):
        shape = a.sharding.shard_shape(a.shape)
        total += math.prod(shape) / shape[a.shape.index(cache.max_len)] * a.dtype.itemsize
    return total


def _layers(config: Any, n: int) -> dict[str, Any]:
    plain = to_plain(config)
    plain["model"] = dict(plain["model"], n_layers=n, scan_layers=False)
    return plain


def compile_speculative(config: Any, devices: list[Any], spec: DeviceSpec) -> dict[str, Any]:
    """Compiles the plain decode step as configured (its memory: the round's programs hold the
    same weights and cache, and a step that writes the cache needs the most) and every program
    of speculative_programs, logits only, with 2 and 3 layers unrolled (their cost,
    extrapolated to the model's layers), and projects each k's bytes per accepted token: the
    compile.json record ({"programs": name -> {"cost_analysis": the extrapolated count, ...},
    the decode step's with compile_program's figures; "rounds": one row per k})."""
    full = speculative_programs(config, devices)
    counted = {n: speculative_programs(_layers(config, n), devices, reads=True) for n in BASIS}
    inf = aot.InferenceConfig(**to_plain(config)["inference"])
    ks, acc = _check(inf)
    plain = full[PLAIN]
    layers = aot.ModelConfig.from_dict(to_plain(config)["model"]).n_layers
    recs: dict[str, Any] = {}
    for name in full:
        rec = aot.compile_program(plain, spec) if name == PLAIN else {}
        c2, c3 = (
            hlo_stats.cost_analysis(counted[n][name].fn.lower(*counted[n][name].args).compile())
            for n in BASIS
        )
        rec["cost_2_3_layers"] = [c2, c3]
        rec["cost_analysis"] = {k: c2[k] + (layers - 2) * (c3[k] - c2[k]) for k in c2}
        if "hlo_text" in rec:  # the roofline at the counted FLOPs
            rec["flops_per_device"] = rec["cost_analysis"]["flops"]
            rec["flops_per_step"] = rec["flops_per_device"] * plain.mesh.size
            rec = aot.analyze(rec, rec["hlo_text"], spec)
        recs[name] = rec
        print(f"{name}: {rec['cost_analysis']}", flush=True)
    summary = {k: v for k, v in plain.summary.items() if k != "program"}
    out = {
        "kind": "speculative",
        "summary": summary | {"spec_ks": list(ks), "acceptance": list(acc)},
        "devices": plain.mesh.size,
        "device": dataclasses.asdict(spec),
        "slot_bytes": slot_bytes(plain.args[1]),
        "weight_bytes": sum(  # per device
            math.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize
            for a in jax.tree.leaves(plain.args[0])
        ),
        "programs": recs,
    }
    out["rounds"] = rounds(out, ks, acc, summary["two_streams"], spec)
    return out


def bytes_of(rec: dict[str, Any], name: str) -> float:
    """A program's counted bytes (logits only) plus the slots its cache write stores: one per
    row for a decode / draft step and a two-stream verify pass (the last draft's K/V), k + 1
    for a single-stream arm's verify pass."""
    r = rec["programs"][name]
    if name in (PLAIN, DRAFT):
        tokens = 1
    else:
        tokens = 1 if rec["summary"]["two_streams"] else int(name.removeprefix("verify_k")) + 1
    return r["cost_analysis"]["bytes accessed"] + tokens * rec["slot_bytes"]


def model_bytes(rec: dict[str, Any], k: int) -> tuple[float, float, float]:
    """docs/speculative.md's cost model per device: (plain step, draft step, verify pass) bytes
    from the weights W and a slot of every row and layer b: Orthros W + (T + w) b, W + (w +
    w_d) b, W + (T + w) b; a single-stream arm W + T b, W + w_d b, W + T b + (k + 1) b (the K/V
    rewritten). T: the cache's slots (a full cache), w: the window, w_d: the draft window."""
    s, w_b, b = rec["summary"], rec["weight_bytes"], rec["slot_bytes"]
    t, w, wd = s["max_len"], s["window"], s["draft_window"]
    if s["two_streams"]:
        return w_b + (t + w) * b, w_b + (w + wd) * b, w_b + (t + w) * b
    return w_b + t * b, w_b + wd * b, w_b + (t + k + 1) * b


def rounds(
    rec: dict[str, Any],
    ks: tuple[int, ...],
    acc: tuple[float, ...],
    two_streams: bool,
    spec: DeviceSpec,
) -> list[dict[str, Any]]:
    """Per k: a round's bytes (drafts x draft step + verify), bytes per accepted token at the
    acceptance a, plain decode's bytes per token and their ratio (the projected speedup);
    HBM-bound ms per token at spec's bandwidth."""
    rows = []
    plain, draft = bytes_of(rec, PLAIN), bytes_of(rec, DRAFT)
    for k, a in zip(ks, acc, strict=True):
        drafts = k
        verify = bytes_of(rec, verify_name(k))
        per_round = drafts * draft + verify
        m_plain, m_draft, m_verify = model_bytes(rec, k)
        rows.append(
            {
                "model_round_over_step": (drafts * m_draft + m_verify) / m_plain,
                "model_projected_speedup": m_plain * a / (drafts * m_draft + m_verify),
                "k": k,
                "acceptance": a,
                "draft_steps": drafts,
                "plain_bytes_per_token": plain,
                "draft_bytes": draft,
                "verify_bytes": verify,
                "round_bytes": per_round,
                "round_over_step": per_round / plain,
                "spec_bytes_per_token": per_round / a,
                "projected_speedup": plain * a / per_round,
                "plain_ms_per_token": 1e3 * plain / spec.hbm_bandwidth,
                "spec_ms_per_token": 1e3 * per_round / a / spec.hbm_bandwidth,
            }
        )
    return rows


def markdown(rec: dict[str, Any], command: str = "") -> str:
    """The record as markdown: each program's bytes, FLOPs and memory, then the projection."""
    from benchmarks.aot_table import gib

    s, dev = rec["summary"], rec["device"]
    lines = [
        f"{s['architecture']}, {s['params'] / 1e9:.2f}B params, batch {s['batch']} at "
        f"{s['max_len']} slots, draft window {s['draft_window']}, {s['attention_impl']}; "
        f"{rec.get('target', '?')}: {rec['devices']} x {dev['name']} "
        f"({', '.join(f'{k}={v}' for k, v in s['mesh'].items())}); per device",
        "",
        "| program | bytes accessed (cache write in place) | GFLOP | peak as configured (HBM) |",
        "|---|---:|---:|---|",
    ]
    for name, r in rec["programs"].items():
        if "bytes_per_device" in r:
            fits = f"{gib(r['bytes_per_device']['peak'])} ({gib(dev['hbm_bytes'])})"
        else:
            fits = f"does not fit: {r['error'][:80]}" if "error" in r else "-"
        lines.append(
            f"| {name} | {gib(bytes_of(rec, name))} | "
            f"{r['cost_analysis']['flops'] / 1e9:.1f} | {fits} |"
        )
    lines += [
        "",
        "| k | a | round / plain step | bytes / accepted token | plain bytes / token | "
        "projected speedup |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rec["rounds"]:
        lines.append(
            f"| {r['k']} | {r['acceptance']} | {r['round_over_step']:.2f} | "
            f"{gib(r['spec_bytes_per_token'])} | {gib(r['plain_bytes_per_token'])} | "
            f"{r['projected_speedup']:.2f}x (projection) |"
        )
    if command:
        lines += ["", f"`{command}`"]
    return "\n".join(lines) + "\n"


def table(recs: list[dict[str, Any]]) -> str:
    """docs/speculative.md's table from several records: one row per record and k."""
    from benchmarks.aot_table import gib

    lines = [
        "| arm | target (mesh) | batch | decode / draft / verify per device | peak (HBM) | k | "
        "round / plain step | bytes / accepted token vs plain | projected speedup | "
        "cost model: round / step, projected |",
        "|---|---|---|---|---|---|---:|---:|---:|---:|",
    ]
    for rec in recs:
        s, progs = rec["summary"], rec["programs"]
        mesh = ", ".join(f"{k}={v}" for k, v in s["mesh"].items() if v > 1) or "1 chip"
        mem = progs[PLAIN].get("bytes_per_device")
        peak = f"{gib(mem['peak'])} ({gib(rec['device']['hbm_bytes'])})" if mem else "no"
        for r in rec["rounds"]:
            lines.append(
                f"| {s['architecture']} | {rec['target']} ({mesh}) | {s['batch']} | "
                f"{gib(r['plain_bytes_per_token'])} / {gib(r['draft_bytes'])} / "
                f"{gib(r['verify_bytes'])} | {peak} | {r['k']} | {r['round_over_step']:.2f} | "
                f"{gib(r['spec_bytes_per_token'])} vs {gib(r['plain_bytes_per_token'])} | "
                f"{r['projected_speedup']:.2f}x at a = {r['acceptance']} (projection) | "
                f"{r['model_round_over_step']:.2f}, {r['model_projected_speedup']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import json
    import sys

    records = []
    for path in sys.argv[1:]:
        with open(path) as f:
            rec = json.load(f)
        # The round as this code runs it, from the record's programs (a record keeps the
        # rounds of the code that compiled it).
        ks = tuple(r["k"] for r in rec["rounds"])
        acc = tuple(r["acceptance"] for r in rec["rounds"])
        spec = DeviceSpec(**rec["device"])
        rec["rounds"] = rounds(rec, ks, acc, rec["summary"]["two_streams"], spec)
        records.append(rec)
    print(table(records), end="")
