r"""Table 4 through the server, and throughput / TTFT against concurrency (issue 21, item 5).

    python benchmarks/serve_load.py --out=runs/serve_load
    python benchmarks/serve_load.py --out=runs/serve_load --shapes=4096/32,4096/256 --concurrency=1,4

Each arm of the Table 4 pairs (orthros_jax.bench_table4: the bench model of configs/bench.py,
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
cache of its length) is timed at the same lengths in the same run, interleaved: the target is
Orthros's TTFT speedup through the server within 10 % of that one.

Concurrency (the Orthros arm): N clients send one request each at once (mixed prompt lengths,
--conc_new tokens) to an engine of N slots, against `generate` on the same N prompts as one
batch; tokens/s = N * new / wall time. generate returns every token at its end, so its TTFT
is its prefill of the batch (inference.prefill timed alone, a lower bound). Target: the
engine's tokens/s within 10 % of generate's at each N. Greedy tokens of both are compared.

Writes --out/serve_load.json (every number), serve_load.md (the tables), serve_load.png.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import statistics
import time

import jax
import numpy as np
import openai
from absl import app, flags

from orthros_jax import bench_table4, inference
from orthros_jax import benchmarking as bench
from orthros_jax.configlib import load_config_file
from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.model import init_params
from orthros_jax.serving.api import create_app
from orthros_jax.serving.background import BackgroundServer
from orthros_jax.serving.engine import Engine

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
flags.DEFINE_integer("conc_max_len", 256, "Longest prompt of the sweep (also its prefill bucket).")
flags.DEFINE_integer("conc_new", 32, "New tokens per request of the sweep.")
flags.DEFINE_integer("repeats", 2, "Rounds of the prefill reference.")
flags.mark_flags_as_required(["out"])
NAME = "bench"
TOK = ByteTokenizer()


async def _one(client, ids: list[int], new: int, t0: float) -> dict:
    """One streamed greedy request: its first-token and end times (from t0) and its tokens."""
    first, n = None, 0
    stream = await client.completions.create(
        model=NAME, prompt=ids, max_tokens=new, temperature=0, stream=True, logprobs=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    async for chunk in stream:
        lp = chunk.choices[0].logprobs if chunk.choices else None
        got = len(lp.tokens) if lp and lp.tokens else 0
        if got and first is None:
            first = time.perf_counter() - t0
        n += got
    return {"ttft_s": first, "end_s": time.perf_counter() - t0, "tokens": n}


async def _burst(url: str, prompts: list[list[int]], new: int) -> dict:
    """All prompts sent at once; the batch's Table 4 metrics."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
    t0 = time.perf_counter()
    reqs = await asyncio.gather(*(_one(client, p, new, t0) for p in prompts))
    e2e = max(r["end_s"] for r in reqs)
    tokens = sum(r["tokens"] for r in reqs)
    last_first = max(r["ttft_s"] for r in reqs)
    after_first = tokens - len(reqs)
    return {
        "ttft_s": statistics.mean(r["ttft_s"] for r in reqs),
        "ttft_each_s": [r["ttft_s"] for r in reqs],
        "e2e_s": e2e,
        "tokens": tokens,
        "output_tok_s": tokens / e2e,
        "decode_tok_s": after_first / (e2e - last_first)
        if after_first and e2e > last_first
        else None,
    }


def _serve(cfg, params, *, slots: int, max_len: int, lengths: tuple[int, ...], batches=None):
    engine = Engine(params, cfg, max_batch=slots, max_len=max_len, chunk_budget=max(lengths) * slots,
                    prefill_lengths=lengths, prefill_batches=batches, decode_text=TOK.decode)  # fmt: skip
    t = time.perf_counter()
    engine.warmup()
    return BackgroundServer(create_app(engine, TOK, NAME)), time.perf_counter() - t


def table4(c, shapes: list[tuple[int, int]], pairs: list[tuple[str, str]]) -> dict:
    cfgs = bench_table4.table4_arms(c)
    params = bench_table4.table4_params(cfgs, c.seed)
    rng = np.random.default_rng(c.seed)
    prompts = {s: [rng.integers(0, 256, s[0]).tolist() for _ in range(2)] for s in shapes}
    max_len = -(-max(i + o for i, o in shapes) // 128) * 128
    chunk = cfgs["orthros"].prefill_chunk
    rows: dict[str, dict] = {f"{i}/{o}": {} for i, o in shapes}
    compile_s = {}
    for arm in [a for pair in pairs for a in pair]:
        # One request prefills per step (chunk_budget = one chunk): the paper's two requests
        # arrive together, the first prefills, then the second while the first decodes.
        engine_server, compile_s[arm] = _serve(cfgs[arm], params[arm], slots=2, max_len=max_len,
                                               lengths=(chunk,), batches=(1,))  # fmt: skip
        with engine_server as server:
            for shape in shapes:
                row = asyncio.run(_burst(server.url, prompts[shape], shape[1]))
                rows[f"{shape[0]}/{shape[1]}"][arm] = row
                print(f"table4 {arm} {shape}: {json.dumps(_brief(row))}", flush=True)
    ref = {}
    for t in sorted({i for i, _ in shapes}):
        calls = {
            a: bench.prefill_call(cfgs[a], params[a], t, c, fresh_cache=True)
            for a in cfgs
            if any(a in p for p in pairs)
        }
        ref[t] = bench.time_interleaved(calls, FLAGS.repeats)
        print(
            f"prefill reference T={t}: "
            + json.dumps({a: round(r["median_s"], 3) for a, r in ref[t].items()}),
            flush=True,
        )
    for key, row in rows.items():
        t = int(key.split("/")[0])
        for single, two in pairs:
            server_x = row[single]["ttft_s"] / row[two]["ttft_s"]
            prefill_x = ref[t][single]["median_s"] / ref[t][two]["median_s"]
            row[f"{single}_over_{two}"] = {"ttft_speedup": server_x, "prefill_speedup": prefill_x,
                                           "ttft_vs_prefill": server_x / prefill_x}  # fmt: skip
    return {"rows": rows, "prefill_reference": {str(t): r for t, r in ref.items()}, "compile_s": compile_s,
            "max_len": max_len}  # fmt: skip


def concurrency(c, counts: list[int]) -> list[dict]:
    cfg = bench_table4.table4_arms(c)["orthros"]
    params = init_params(cfg, jax.random.PRNGKey(c.seed))
    rng = np.random.default_rng(c.seed + 1)
    lo, hi, new = FLAGS.conc_min_len, FLAGS.conc_max_len, FLAGS.conc_new
    max_len = -(-(hi + new) // 128) * 128
    out = []
    for n in counts:
        prompts = [rng.integers(0, 256, int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]
        # All N prompts prefill in one step (P = N rows of `hi` tokens), as generate's one call.
        server, _ = _serve(cfg, params, slots=n, max_len=max_len, lengths=(hi,), batches=(n,))
        with server:
            asyncio.run(_burst(server.url, prompts[:1], 2))  # the HTTP path warm
            eng = asyncio.run(_burst(server.url, prompts, new))
        run = lambda: inference.generate(
            params, prompts, cfg, max_new_tokens=new, cache_size=max_len
        )
        pre = lambda: inference.prefill(params, inference.init_cache(cfg, n, max_len), _padded(prompts),
                                        [len(p) for p in prompts], cfg)[0]  # fmt: skip
        jax.block_until_ready(pre())
        t = time.perf_counter()
        jax.block_until_ready(pre())
        gen_ttft = time.perf_counter() - t
        run()  # compiles
        t = time.perf_counter()
        gen_out = run()
        gen_s = time.perf_counter() - t
        row = {
            "clients": n, "engine": eng,
            "generate": {"e2e_s": gen_s, "output_tok_s": n * new / gen_s, "ttft_s": gen_ttft},
            "engine_over_generate_tok_s": eng["output_tok_s"] / (n * new / gen_s),
        }  # fmt: skip
        row["generate"]["tokens"] = int(gen_out.lengths.sum())
        out.append(row)
        print(f"concurrency {n}: engine {eng['output_tok_s']:.1f} tok/s TTFT {eng['ttft_s']:.3f}s | generate "
              f"{row['generate']['output_tok_s']:.1f} tok/s | ratio {row['engine_over_generate_tok_s']:.3f}", flush=True)  # fmt: skip
    return out


def _padded(prompts: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
    for i, p in enumerate(prompts):
        out[i, : len(p)] = p
    return out


def _brief(row: dict) -> dict:
    return {k: round(v, 3) for k, v in row.items() if isinstance(v, float)}


def main(argv: list[str]) -> None:
    del argv
    from serve_load_report import write_report

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
                ("out", FLAGS.out),
            )
        ),  # fmt: skip
        "table4": table4(c, shapes, pairs) if shapes else None,
        "concurrency": concurrency(c, [int(n) for n in FLAGS.concurrency if n]),
    }
    results["load_after"], results["wall_s"] = os.getloadavg()[0], time.perf_counter() - t0
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, "serve_load.json"), "w") as f:
        json.dump(results, f, indent=1)
    write_report(results, FLAGS.out, pairs)
    print(f"wrote {FLAGS.out}/serve_load.{{json,md,png}} in {results['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    app.run(main)
