r"""Table 4 through the server, and throughput / TTFT against concurrency (issue 21, item 5).

    python benchmarks/serve_load.py --out=runs/serve_load
    python benchmarks/serve_load.py --out=runs/serve_load --shapes=4096/32,4096/256 \
        --concurrency=1,4

Each arm of the Table 4 pairs (benchmarks.table4: the bench model of configs/bench.py,
two layer cycles; Transformer vs Orthros and Linear Hybrid vs Orthros-H, each pair sharing its
weights) is served by the engine + OpenAI app (orthros_jax/serving) on 127.0.0.1 in this
process, and an async `openai` client replays the paper's protocol: per shape input/output,
two concurrent requests of random token ids (greedy, ignore_eos, streamed with logprobs so
every token is one chunk). Per shape and arm:
  TTFT          mean over the two requests of send -> first token
  E2E           send -> both requests done
  output tok/s  all tokens of the batch / E2E
  decode tok/s  tokens after each request's first / (E2E - the later first token)
The prefill benchmark (benchmarking.prefill_call: inference.prefill of one prompt into a fresh
cache of its length) is timed at the same lengths in the same run, interleaved (the speedups are
medians over rounds of each round's ratio): the target is Orthros's TTFT speedup through the
server within 10 % of that one.

Concurrency (the Orthros arm): N requests at once (mixed prompt lengths, --conc_new tokens) to
an engine of N slots, submitted to the engine itself and sent by N clients through HTTP, against
`generate` on the same N prompts as one batch; tokens/s = N * new / wall time. generate returns
every token at its end, so its TTFT is its prefill of the batch (inference.prefill timed alone,
a lower bound). The three alternate for --repeats rounds (tables: the best of each); the ratios
to generate are medians over rounds of the ratio within a round. Target: the engine's tokens/s
within 10 % of generate's at each N. Compiles while serving are counted (device.compile_count).

Writes --out/serve_load.json (every number), serve_load.md (the tables), serve_load.png.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import statistics
import sys
import time

import jax
import numpy as np
from absl import app, flags

from orthros_jax import inference
from orthros_jax.config.cli import load_config_file
from orthros_jax.model import init_params
from orthros_jax.serving import device

# benchmarks/ lives beside launch/, outside the installed package.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import common as bench  # noqa: E402
from benchmarks import table4 as bench_table4  # noqa: E402
from benchmarks.common import ORTHROS  # noqa: E402
from benchmarks.serve_clients import CLIENT, direct, serve  # noqa: E402
from benchmarks.serve_load_report import write_report  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_string("out", None, "Output directory.")
    flags.DEFINE_string(
        "config", os.path.join(ROOT, "configs", "bench.py"), "Bench config (the model)."
    )
    flags.DEFINE_list(
        "shapes", ["2048/16", "2048/128", "1920/512"], "Table 4 input/output token pairs."
    )
    flags.DEFINE_list(
        "pairs", ["transformer:orthros", "hybrid:orthros_h"], "single:two-stream arm pairs."
    )
    flags.DEFINE_list(
        "concurrency", ["1", "2", "4", "8", "16"], "Client counts of the sweep ('' = none)."
    )
    flags.DEFINE_integer("conc_min_len", 64, "Shortest prompt of the sweep.")
    flags.DEFINE_integer(
        "conc_max_len", 256, "Longest prompt of the sweep (also its prefill bucket)."
    )
    flags.DEFINE_integer("conc_new", 32, "New tokens per request of the sweep.")
    flags.DEFINE_integer("repeats", 2, "Interleaved rounds of the TTFT and concurrency timings.")
    flags.DEFINE_integer("decode_steps", 4, "Engine decode steps per device call (multi-step).")
    flags.DEFINE_integer(
        "t4_step_chunks", 2, "Table 4: prefill chunks of one request per engine step (its budget)."
    )
    flags.DEFINE_float("batch_wait_ms", 50.0, "Sweep: how long an idle engine lets a burst gather.")


def table4(c, shapes: list[tuple[int, int]], pairs: list[tuple[str, str]]) -> dict:
    """The Table 4 protocol once per shape and arm, then --repeats interleaved rounds of TTFT
    only (the same two requests with 1 output token) beside the prefill benchmark's call."""
    cfgs = bench_table4.table4_arms(c)
    params = bench_table4.table4_params(cfgs, c.seed)
    arms = [a for pair in pairs for a in pair]
    rng = np.random.default_rng(c.seed)
    prompts = {s: [rng.integers(0, 256, s[0]).tolist() for _ in range(2)] for s in shapes}
    max_len = -(-max(i + o for i, o in shapes) // 128) * 128
    chunk = cfgs[ORTHROS].prefill_chunk
    rows: dict[str, dict] = {f"{i}/{o}": {} for i, o in shapes}
    compile_s, urls = {}, {}
    with contextlib.ExitStack() as stack:
        for arm in arms:  # every arm's server up at once, so their calls can interleave
            # One request prefills per step (P = 1, up to --t4_step_chunks prefill chunks): the
            # paper's two requests arrive together; the first prefills, then the second while
            # the first decodes.
            steps = tuple(chunk * k for k in range(1, FLAGS.t4_step_chunks + 1))
            srv, compile_s[arm], _ = serve(
                cfgs[arm],
                params[arm],
                slots=2,
                max_len=max_len,
                lengths=steps,
                batches=(1,),
                decode_steps=FLAGS.decode_steps,
            )
            urls[arm] = stack.enter_context(srv).url
            CLIENT.burst(urls[arm], [[1, 2, 3]], 2)  # the HTTP path warm
        compiled = device.compile_count()
        for shape in shapes:
            for arm in arms:
                row = CLIENT.burst(urls[arm], prompts[shape], shape[1])
                rows[f"{shape[0]}/{shape[1]}"][arm] = row
                print(f"table4 {arm} {shape}: {json.dumps(_brief(row))}", flush=True)
        by_len = {i: prompts[(i, o)] for i, o in shapes}
        calls = {
            t: {a: bench.prefill_call(cfgs[a], params[a], t, c, fresh_cache=True) for a in arms}
            for t in by_len
        }
        for fns in calls.values():
            for fn in fns.values():
                jax.block_until_ready(fn())  # compiles
        server_s = {t: {a: [] for a in arms} for t in by_len}
        prefill_s = {t: {a: [] for a in arms} for t in by_len}
        for _ in range(FLAGS.repeats):
            for t, two_prompts in by_len.items():
                for a in arms:
                    server_s[t][a].append(CLIENT.burst(urls[a], two_prompts, 1)["ttft_s"])
                    t0 = time.perf_counter()
                    jax.block_until_ready(calls[t][a]())
                    prefill_s[t][a].append(time.perf_counter() - t0)
        recompiles = device.compile_count() - compiled
    ttft = []
    for t in by_len:
        row = {"T": t} | {
            a: {
                "server_ttft_s": statistics.median(server_s[t][a]),
                "server_rounds_s": server_s[t][a],
                "prefill_s": statistics.median(prefill_s[t][a]),
                "prefill_rounds_s": prefill_s[t][a],
            }
            for a in arms
        }
        for single, two in pairs:  # ratios round by round (a shared box drifts), then medians
            sx = _round_ratio(server_s[t][single], server_s[t][two])
            px = _round_ratio(prefill_s[t][single], prefill_s[t][two])
            row[f"{single}_over_{two}"] = {
                "ttft_speedup": sx,
                "prefill_speedup": px,
                "ttft_vs_prefill": sx / px,
            }
        ttft.append(row)
        print(
            f"TTFT T={t}: " + json.dumps({k: v for k, v in row.items() if "_over_" in k}),
            flush=True,
        )
    return {
        "rows": rows,
        "ttft": ttft,
        "compile_s": compile_s,
        "max_len": max_len,
        "compiles_while_serving": recompiles,
    }


def concurrency(c, counts: list[int]) -> list[dict]:
    cfg = bench_table4.table4_arms(c)[ORTHROS]
    params = init_params(cfg, jax.random.PRNGKey(c.seed))
    rng = np.random.default_rng(c.seed + 1)
    lo, hi, new = FLAGS.conc_min_len, FLAGS.conc_max_len, FLAGS.conc_new
    max_len = -(-(hi + new) // 128) * 128
    buckets = tuple(range(64, hi, 64)) + (hi,)  # prompts pad to the next multiple of 64
    out = []
    for n in counts:
        prompts = [rng.integers(0, 256, int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]
        # The N prompts prefill in P-row calls (P a power of two <= N) of 64, 128, ... tokens;
        # an idle engine waits up to 50 ms for a burst to arrive, so a burst sent together
        # prefills in one call, as generate's does.
        server, _, engine = serve(
            cfg,
            params,
            slots=n,
            max_len=max_len,
            lengths=buckets,
            batch_wait_s=FLAGS.batch_wait_ms / 1000,
            decode_steps=FLAGS.decode_steps,
        )
        run = lambda: inference.generate(
            params, prompts, cfg, max_new_tokens=new, cache_size=max_len
        )
        pre = lambda: inference.prefill(
            params,
            inference.init_cache(cfg, n, max_len),
            _padded(prompts),
            [len(p) for p in prompts],
            cfg,
        )[0]
        jax.block_until_ready(pre())
        gen_out = run()  # compiles
        srvs, engs, gens, pres = [], [], [], []
        with server:
            CLIENT.burst(server.url, prompts[:1], 2)  # the HTTP path warm
            compiled = device.compile_count()
            for _ in range(FLAGS.repeats):  # interleaved rounds: a shared box drifts
                engs.append(direct(engine, prompts, new))
                srvs.append(CLIENT.burst(server.url, prompts, new))
                t = time.perf_counter()
                gen_out = run()
                gens.append(time.perf_counter() - t)
                t = time.perf_counter()
                jax.block_until_ready(pre())
                pres.append(time.perf_counter() - t)
            recompiles = device.compile_count() - compiled
        best = lambda rs: (
            min(rs, key=lambda r: r["e2e_s"]) | {"e2e_rounds_s": [r["e2e_s"] for r in rs]}
        )
        eng, srv = best(engs), best(srvs)
        gen_s, gen_ttft = min(gens), min(pres)
        gen_tok_s = n * new / gen_s
        # The targets compare within a round (the engine, HTTP and generate run back to back),
        # the median over rounds: one round where the machine's load moved cannot decide them.
        per_round = lambda rs: _round_ratio(gens, [r["e2e_s"] for r in rs])
        row = {
            "clients": n,
            "engine": eng,
            "server": srv,
            "generate": {
                "e2e_s": gen_s,
                "output_tok_s": gen_tok_s,
                "ttft_s": gen_ttft,
                "e2e_rounds_s": gens,
            },
            "compiles_while_serving": recompiles,
            "engine_over_generate_tok_s": per_round(engs),
            "server_over_generate_tok_s": per_round(srvs),
        }
        row["generate"]["tokens"] = int(gen_out.lengths.sum())
        out.append(row)
        print(
            f"concurrency {n}: engine {eng['output_tok_s']:.1f} tok/s"
            f" TTFT {eng['ttft_s']:.3f}s"
            f" | server {srv['output_tok_s']:.1f} tok/s TTFT {srv['ttft_s']:.3f}s"
            f" | generate {gen_tok_s:.1f} tok/s"
            f" | engine/generate {row['engine_over_generate_tok_s']:.3f}",
            flush=True,
        )
    return out


def _round_ratio(num: list[float], den: list[float]) -> float:
    """The median over rounds of num[r] / den[r]."""
    return statistics.median(a / b for a, b in zip(num, den, strict=True))


def _padded(prompts: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
    for i, p in enumerate(prompts):
        out[i, : len(p)] = p
    return out


def _brief(row: dict) -> dict:
    return {k: round(v, 3) for k, v in row.items() if isinstance(v, float)}


def main(argv: list[str]) -> None:
    del argv
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    c = load_config_file(FLAGS.config)
    shapes = [tuple(int(x) for x in s.split("/")) for s in FLAGS.shapes]
    pairs = [tuple(p.split(":")) for p in FLAGS.pairs]
    t0 = time.perf_counter()
    results = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "backend": jax.default_backend(),
        "load_before": os.getloadavg()[0],
        "command": "python benchmarks/serve_load.py "
        + " ".join(
            f"--{k}={','.join(v) if isinstance(v, list) else v}"
            for k, v in (
                ("shapes", FLAGS.shapes),
                ("pairs", FLAGS.pairs),
                ("concurrency", FLAGS.concurrency),
                ("decode_steps", FLAGS.decode_steps),
                ("batch_wait_ms", FLAGS.batch_wait_ms),
                ("t4_step_chunks", FLAGS.t4_step_chunks),
                ("repeats", FLAGS.repeats),
                ("out", FLAGS.out),
            )
        ),
        "table4": table4(c, shapes, pairs) if shapes else None,
        "concurrency": concurrency(c, [int(n) for n in FLAGS.concurrency if n]),
    }
    results["load_after"], results["wall_s"] = os.getloadavg()[0], time.perf_counter() - t0
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, "serve_load.json"), "w") as f:
        json.dump(results, f, indent=1)
    CLIENT.close()
    write_report(results, FLAGS.out, pairs)
    print(f"wrote {FLAGS.out}/serve_load.{{json,md,png}} in {results['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["out"])
    app.run(main)
