r"""Throughput at equal memory: an int8 KV cache with prefix caching against today's engine
(the model-dtype cache, no prefix caching), on a concurrency sweep through the server.

    python benchmarks/kv_capacity.py --out=runs/kv_capacity
    python benchmarks/kv_capacity.py --out=/tmp/kvc --concurrency=4,8 --system=256 --repeats=1

Both engines get the same cache memory, --memory_mib: each has as many slots (max_batch) of
--max_len tokens as fit it, slots = budget // (bytes per token x max_len), the bytes per token
read from the real cache's shapes (every layer's K/V, the int8 cache's scales included). The
default fits 4 full-precision slots of the bench model (configs/bench.py, float32 on CPU) at
--layers layers; the int8 cache fits ~3.8x as many on CPU (float32 scales), ~1.9x in bfloat16.
  full         model-dtype cache, no prefix caching (the engine as it was)
  int8_prefix  kv_cache_dtype="int8", prefix_caching=True
Both are built and warmed up (every bucket compiled; two untimed bursts warm the HTTP path and
leave the system prompt in the rows, as a server that has served it holds it), then for
--repeats rounds, per N in --concurrency, the same N prompts (a shared --system-token prefix +
a distinct --question-token question, new in every round) are sent at once by N streamed
clients (benchmarks/serve_clients.py: greedy, ignore_eos, --new tokens each) to the full arm,
then to the int8_prefix arm. Per N and arm: tokens/s (all generated tokens / wall, median over
rounds) and mean TTFT (median over rounds); ratios int8_prefix / full are medians over rounds
of each round's ratio (a shared machine's drift hits both arms).
Writes --out/kv_capacity.json (every number) and kv_capacity.md (the tables).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import statistics
import sys
import time

import jax
import numpy as np
from absl import app, flags

from orthros_jax.config.cli import load_config_file
from orthros_jax.model import init_params
from orthros_jax.serving import device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import common as bench  # noqa: E402
from benchmarks.run_record import command_line  # noqa: E402
from benchmarks.serve_clients import CLIENT, serve  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_string("out", None, "Output directory.")
    flags.DEFINE_string("config", os.path.join(ROOT, "configs", "bench.py"), "Bench config.")
    flags.DEFINE_float("memory_mib", 8.0, "Cache memory of each engine (MiB).")
    flags.DEFINE_integer("max_len", 1024, "Cache positions of each slot.")
    flags.DEFINE_integer("layers", 2, "Layers of the model (the bench model's width).")
    flags.DEFINE_list("concurrency", ["4", "8", "16"], "Concurrent clients of the sweep.")
    flags.DEFINE_integer("system", 512, "Tokens of the shared system prefix.")
    flags.DEFINE_integer("question", 16, "Tokens of each request's distinct question.")
    flags.DEFINE_integer("new", 16, "New tokens per request.")
    flags.DEFINE_integer("repeats", 2, "Interleaved rounds.")
    flags.DEFINE_integer("decode_steps", 4, "Engine decode steps per device call.")
    flags.DEFINE_integer("chunk_budget", 1024, "Prompt tokens per engine step.")
    flags.DEFINE_list("prefill_lengths", ["64", "512"], "Prefill length buckets.")
    flags.DEFINE_list("prefill_batches", ["1", "4", "16"], "Prefill row buckets (capped at slots).")
    flags.DEFINE_float("batch_wait_ms", 50.0, "How long an idle engine lets a burst gather.")


ARMS = {
    "full": dict(kv_cache_dtype=None, prefix_caching=False),
    "int8_prefix": dict(kv_cache_dtype="int8", prefix_caching=True),
}
TTFT_HEAD = ["full TTFT s", "int8_prefix TTFT s", "TTFT ratio"]


def capacity(
    cfg,
    params,
    *,
    memory_bytes: float,
    max_len: int,
    counts: list[int],
    system: int,
    question: int,
    new: int,
    repeats: int,
    prefill_lengths: tuple[int, ...],
    batches,
    command: str = "",
    **engine_kw,
) -> dict:
    """The sweep (module docstring), with the date, load and wall time. prefill_lengths x
    batches: the engines' prefill buckets (row buckets capped at the slots); engine_kw: the
    rest of serve_clients.serve's options (chunk_budget, decode_steps, batch_wait_s)."""
    t0, load_before = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 256, system).tolist()
    prompts = lambda n: [prefix + rng.integers(0, 256, question).tolist() for _ in range(n)]
    arms: dict[str, dict] = {}
    for name, kw in ARMS.items():
        bpt = bench.cache_bytes_per_token(cfg, kw["kv_cache_dtype"])
        slots = int(memory_bytes // (bpt * max_len))
        assert slots >= 1, f"{memory_bytes} bytes hold no slot of {max_len} tokens ({name})"
        arms[name] = {"bytes_per_token": bpt, "slots": slots, "cache_bytes": slots * bpt * max_len}
    rounds: dict[int, dict[str, list]] = {n: {a: [] for a in ARMS} for n in counts}
    with contextlib.ExitStack() as stack:
        urls, engines = {}, {}
        for name, kw in ARMS.items():  # both built and compiled before any timing
            slots = arms[name]["slots"]
            server, arms[name]["warmup_s"], engines[name] = serve(
                cfg,
                params,
                slots=slots,
                max_len=max_len,
                lengths=prefill_lengths,
                batches=tuple(sorted({min(int(b), slots) for b in batches})),
                **kw,
                **engine_kw,
            )
            urls[name] = stack.enter_context(server).url
        for url in urls.values():  # the HTTP path warm; the prefix in rows, copy_prefix compiled
            CLIENT.burst(url, prompts(1), 2)
            CLIENT.burst(url, prompts(2), 2)
        compiled = device.compile_count()
        for n in [n for _ in range(repeats) for n in counts]:
            same = prompts(n)  # new questions every round: no prompt is served twice
            for name in ARMS:
                rounds[n][name].append(CLIENT.burst(urls[name], same, new))
        recompiles = device.compile_count() - compiled
    m = engines["int8_prefix"].metrics
    rows = []
    for n in counts:
        row: dict = {"clients": n}
        for name in ARMS:
            rs = rounds[n][name]
            row[name] = {
                "output_tok_s": statistics.median(r["output_tok_s"] for r in rs),
                "ttft_s": statistics.median(r["ttft_s"] for r in rs),
                "tokens": rs[-1]["tokens"],
                "rounds": [{k: r[k] for k in ("output_tok_s", "ttft_s", "e2e_s")} for r in rs],
            }
        pairs = list(zip(rounds[n]["full"], rounds[n]["int8_prefix"], strict=True))
        for out, key in (("tok_s_ratio", "output_tok_s"), ("ttft_ratio", "ttft_s")):
            row[out] = statistics.median(b[key] / a[key] for a, b in pairs)  # int8_prefix / full
        rows.append(row)
        print(f"N={n}: " + json.dumps({k: v for k, v in row.items() if "ratio" in k}), flush=True)
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "backend": jax.default_backend(),
        "command": command,
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": time.perf_counter() - t0,
        "arms": arms,
        "sweep": rows,
        "compiles_while_serving": recompiles,
        "prefix": {"lookups": m.prefix_lookups, "hits": m.prefix_hits, "reused": m.prefix_reused},
    }


def write(result: dict, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "kv_capacity.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "kv_capacity.md"), "w") as f:
        f.write(markdown(result))


def _table(head: list[str], rows: list[list]) -> list[str]:
    line = lambda cells: "| " + " | ".join(map(str, cells)) + " |"
    return [line(head), line(["---"] * len(head)), *map(line, rows)]


def markdown(r: dict) -> str:
    arms, p = r["arms"], r["prefix"]
    size = lambda a: [f"{a['bytes_per_token']:.0f}", a["slots"], f"{a['cache_bytes'] / 2**20:.2f}"]
    speed = lambda s, k: [f"{s['full'][k]:.2f}", f"{s['int8_prefix'][k]:.2f}"]
    sweep = [
        [s["clients"], *speed(s, "output_tok_s"), f"{s['tok_s_ratio']:.2f}"]
        + [*speed(s, "ttft_s"), f"{s['ttft_ratio']:.2f}"]
        for s in r["sweep"]
    ]
    lines = [
        f"{r['date']}, {r['backend']}, load average (1/5/15 min) {r['load_before']} before,"
        f" {r['load_after']} after; {r['wall_s']:.0f} s.",
        "",
        f"    {r['command']}",
        "",
        *_table(
            ["arm", "bytes/token", "slots", "cache MiB", "warm-up s"],
            [[k, *size(a), f"{a['warmup_s']:.1f}"] for k, a in arms.items()],
        ),
        "",
        *_table(["N", "full tok/s", "int8_prefix tok/s", "tok/s ratio"] + TTFT_HEAD, sweep),
        "",
        f"slots int8_prefix / full {arms['int8_prefix']['slots'] / arms['full']['slots']:.2f};"
        f" int8_prefix's prefix cache: {p['hits']} hits of {p['lookups']} lookups,"
        f" {p['reused']} prompt tokens reused; compiles while serving:"
        f" {r['compiles_while_serving']}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    del argv
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    c = load_config_file(FLAGS.config)
    cfg = bench.model_configs(c.model, {"m": {"n_layers": FLAGS.layers}})["m"]
    params = init_params(cfg, jax.random.PRNGKey(c.seed))
    result = capacity(
        cfg,
        params,
        memory_bytes=FLAGS.memory_mib * 2**20,
        max_len=FLAGS.max_len,
        counts=[int(n) for n in FLAGS.concurrency],
        system=FLAGS.system,
        question=FLAGS.question,
        new=FLAGS.new,
        repeats=FLAGS.repeats,
        command=command_line(),
        chunk_budget=FLAGS.chunk_budget,
        prefill_lengths=tuple(int(t) for t in FLAGS.prefill_lengths),
        batches=FLAGS.prefill_batches,
        decode_steps=FLAGS.decode_steps,
        batch_wait_s=FLAGS.batch_wait_ms / 1000,
    )
    CLIENT.close()
    write(result, FLAGS.out)
    print(markdown(result), flush=True)


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["out"])
    app.run(main)
