"""Self-speculative decoding compiled for an accelerator target (launch/compile.py with an
inference config of mode "speculative", e.g. configs/decode_8b.py:speculative): the plain decode
step, the draft step (drivers.decode with draft_window) and the verify pass of each k
(inference/spec_passes.py) as the target's compiler builds them, and the bytes each reads per
accepted token (docs/speculative.md "On accelerators, by compilation").

Bytes and FLOPs are XLA's cost analysis of each compiled per-device program: "bytes accessed",
every instruction's operand and output bytes (a dynamic slice counts its slice, an in-place
update its update). It counts a scanned loop body once, so the programs are compiled with the
layers unrolled (model.scan_layers=False): every layer is counted. A round of a two-stream
model is k + 1 draft steps and one verify pass (a single-stream arm, MagicDec-style: k draft
steps and a verify pass that rewrites the k + 1 tokens' K/V); at a tokens per verify (the
acceptance measured on a trained model, inference.acceptance) it emits a tokens, so

    bytes per accepted token = (drafts * draft + verify) / a,
    projected speedup = plain decode's bytes / that  (a projection: bytes, not time)

XLA's count charges a cache write (a scatter of one slot per row into a layer's stack of every
slot) with the whole stack it updates in place, and a compiler may relayout the whole cache
around it (the TPU compiler's copies; the GPU one's transposes, docs/tpu-gpu.md). So each
program that writes the cache is also compiled returning its logits only ("<name>_reads": the
write is dead code), and the "in place" figures are those reads plus the bytes the write
itself stores (one slot per row and token in every layer).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import aot
from orthros_jax.config.cli import to_plain
from orthros_jax.inference import drivers, spec_passes
from orthros_jax.inference.speculative import Speculative, check
from orthros_jax.parallel import sharding
from orthros_jax.parallel.device_specs import DeviceSpec

PLAIN, DRAFT = "decode", "draft"
READS = "_reads"  # the suffix of a writing program's logits-only twin


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


def speculative_programs(config: Any, devices: list[Any]) -> dict[str, aot.Program]:
    """The decode step, the draft step and one verify pass per k of a speculative inference
    config, layers unrolled (cost analysis counts every layer); ValueError (before any compile)
    for a speculation this model, cache or mesh cannot run."""
    plain = to_plain(config)
    plain["model"] = dict(plain["model"], scan_layers=False)
    st = aot.inference_setup(plain, devices)
    cfg, inf, mesh = st.cfg, st.inf, st.mesh
    ks, _ = _check(inf)
    window = inf.draft_window or cfg.window
    for k in ks:
        check(Speculative(k, window), cfg, inf.max_len, st.sequence)
    summary = st.summary() | {"draft_window": window, "two_streams": cfg.two_streams}

    progs: dict[str, aot.Program] = {}

    def add(name: str, fn: Any, args: tuple, writes: bool) -> None:
        """fn(params, cache, ...) -> (logits, cache) if it writes, else logits."""
        jitted = jax.jit(sharding.traced_under(fn, mesh), donate_argnums=(1,) if writes else ())
        progs[name] = aot.Program(jitted, args, mesh, name, None, summary | {"program": name})
        if writes:  # its logits only: the cache write is dead code
            reads = jax.jit(sharding.traced_under(lambda *a: fn(*a)[0], mesh))
            progs[name + READS] = aot.Program(reads, args, mesh, name, None, summary)

    step = (st.params, st.cache, st.vec(jnp.int32), st.vec(jnp.bool_))
    add(PLAIN, lambda p, c, t, a: drivers.decode(p, c, t, a, cfg=cfg), step, True)
    draft = lambda p, c, t, a: drivers.decode(p, c, t, a, cfg=cfg, draft_window=window)
    add(DRAFT, draft, step, True)
    for k in ks:
        tokens, start = st.vec(jnp.int32, k + 1), st.vec(jnp.int32)
        if cfg.two_streams:  # read-only: the output copies over the whole cache
            fn = lambda p, c, t, s: spec_passes.verify_copies(p, c, t, s, cfg=cfg)
            add(verify_name(k), fn, (st.params, st.cache, tokens, start), False)
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


def compile_speculative(config: Any, devices: list[Any], spec: DeviceSpec) -> dict[str, Any]:
    """Compiles every program of speculative_programs and projects each k's bytes per accepted
    token: the compile.json record ({"programs": name -> compile_program's record, "rounds":
    one row per k})."""
    progs = speculative_programs(config, devices)
    inf = aot.InferenceConfig(**to_plain(config)["inference"])
    ks, acc = _check(inf)
    plain = progs[PLAIN]
    recs: dict[str, Any] = {}
    for name, prog in progs.items():
        recs[name] = aot.compile_program(prog, spec)
        print(f"{name}: {recs[name].get('cost_analysis')}", flush=True)
    summary = {k: v for k, v in plain.summary.items() if k != "program"}
    out = {
        "kind": "speculative",
        "summary": summary | {"spec_ks": list(ks), "acceptance": list(acc)},
        "devices": plain.mesh.size,
        "device": recs[PLAIN]["device"],
        "slot_bytes": slot_bytes(plain.args[1]),
        "programs": recs,
    }
    out["rounds"] = rounds(out, ks, acc, summary["two_streams"], spec)
    return out


def _bytes(rec: dict[str, Any], name: str, in_place: bool, tokens: int) -> float | None:
    """A program's bytes as compiled, or (in_place) its logits-only twin's plus the `tokens`
    slots per row its write stores; None where the compiler refused one for memory."""
    progs = rec["programs"]
    if in_place and name + READS in progs:
        r = progs[name + READS]
        if "cost_analysis" not in r:
            return None
        return r["cost_analysis"]["bytes accessed"] + tokens * rec["slot_bytes"]
    r = progs[name]
    return r["cost_analysis"]["bytes accessed"] if "cost_analysis" in r else None


def rounds(
    rec: dict[str, Any],
    ks: tuple[int, ...],
    acc: tuple[float, ...],
    two_streams: bool,
    spec: DeviceSpec,
) -> list[dict[str, Any]]:
    """Per k: a round's bytes (drafts x draft step + verify), bytes per accepted token at the
    acceptance a, plain decode's bytes per token and their ratio (the projected speedup), as
    compiled and with the cache writes in place; HBM-bound ms per token at spec's bandwidth."""
    rows = []
    for k, a in zip(ks, acc, strict=True):
        drafts = k + 1 if two_streams else k
        row: dict[str, Any] = {"k": k, "acceptance": a, "draft_steps": drafts}
        for label, in_place in (("compiled", False), ("in_place", True)):
            plain = _bytes(rec, PLAIN, in_place, 1)
            draft = _bytes(rec, DRAFT, in_place, 1)
            verify = _bytes(rec, verify_name(k), in_place, k + 1)
            if plain is None or draft is None or verify is None:
                row[label] = None
                continue
            per_round = drafts * draft + verify
            row[label] = {
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
        rows.append(row)
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
        "| program | bytes accessed (as compiled) | cache write in place | GFLOP | peak (HBM) |",
        "|---|---:|---:|---:|---|",
    ]
    names = [n for n in rec["programs"] if not n.endswith(READS)]
    for name in names:
        r = rec["programs"][name]
        if "cost_analysis" not in r:
            lines.append(f"| {name} | - | - | - | does not fit: {r.get('error', '')[:80]} |")
            continue
        k = int(name.removeprefix("verify_k")) if name.startswith("verify") else 0
        in_place = _bytes(rec, name, True, k + 1)
        lines.append(
            f"| {name} | {gib(r['cost_analysis']['bytes accessed'])} | "
            f"{'-' if in_place is None else gib(in_place)} | "
            f"{r['cost_analysis']['flops'] / 1e9:.1f} | "
            f"{gib(r['bytes_per_device']['peak'])} ({gib(dev['hbm_bytes'])}) |"
        )
    lines += [
        "",
        "| k | a | round / plain step | bytes / accepted token | plain bytes / token | "
        "projected speedup | as compiled |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rec["rounds"]:
        c, p = r["compiled"], r["in_place"]
        if c is None or p is None:
            lines.append(f"| {r['k']} | {r['acceptance']} | - | - | - | - | - |")
            continue
        lines.append(
            f"| {r['k']} | {r['acceptance']} | {p['round_over_step']:.2f} | "
            f"{gib(p['spec_bytes_per_token'])} | {gib(p['plain_bytes_per_token'])} | "
            f"{p['projected_speedup']:.2f}x (projection) | "
            f"{c['projected_speedup']:.2f}x (projection) |"
        )
    if command:
        lines += ["", f"`{command}`"]
    return "\n".join(lines) + "\n"
