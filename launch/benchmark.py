"""The benchmark: Orthros vs the Transformer arm vs the token-wise floor, one suite per figure.

    python launch/benchmark.py --config=configs/bench.py --out=runs/bench
    python launch/benchmark.py --config=configs/bench.py --config.prefill_lengths='(1024,2048)' \
        --suites=prefill,memory --out=runs/bench_small

Suites: prefill (library prefill vs the floor), honesty (Transformer arm vs dense attention),
memory (compiled prefill temp bytes), decode (decode_step per context), train (a PT step),
inference (TTFT and decode tokens/s through the serving API: prefill, decode_step, generate),
speculative (self-speculative / plain decode tokens/s per context, benchmarks/spec_suite.py;
not run by default),
window (the window-attention kernel alone; not run by default), sequence (sequence-parallel
prefill on 8 devices, benchmarks/sequence.py; not run by default; configs/bench_sequence.py
has its command), table4 (the paper's Table 4 pairs, Linear Hybrid vs Orthros-H and Transformer
vs Orthros, benchmarks/table4.py; not run by default; configs/bench_hybrid.py).
Everything is measured side by side in one process (the machine is shared and noisy, so only
ratios from one run mean anything). Writes bench.json (every number) into --out; bench.md and
bench.png when one of the suites before `sequence` ran, sequence.md/png and table4.md/png when
those did.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from orthros_jax.config import ModelConfig, cli
from orthros_jax.inference import decode_step, generate, prefill
from orthros_jax.inference.cache import init_cache
from orthros_jax.inference.drivers import prefill_jit
from orthros_jax.model import init_params

# benchmarks/ lives beside launch/, outside the installed package.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks import common as bench  # noqa: E402
from benchmarks import sequence as bench_sequence  # noqa: E402
from benchmarks import spec_suite  # noqa: E402
from benchmarks import table4 as bench_table4  # noqa: E402
from benchmarks.common import ORTHROS, TRANSFORMER  # noqa: E402
from benchmarks.report import write_report  # noqa: E402
from orthros_jax.layers import flops  # noqa: E402

_CONFIG = cli.define_config_flag("configs/bench.py", "Benchmark config.", "benchmark.py")
_OUT = flags.DEFINE_string("out", None, "Directory for bench.json and the reports.")
_SUITES = flags.DEFINE_list(
    "suites", ["prefill", "honesty", "memory", "decode", "train", "inference"], "Suites to run."
)


def arms(c) -> dict[str, ModelConfig]:
    """Orthros and the Transformer arm with the same shared weights (bf16 on accelerators)."""
    return bench.model_configs(
        c.model,
        {
            ORTHROS: {"architecture": ORTHROS},
            TRANSFORMER: {"architecture": TRANSFORMER, "scale_offset": False},
        },
    )


def prefill_suite(c, cfgs, params, results) -> None:
    floor = bench.floor_prefill(cfgs[TRANSFORMER])
    rows = []
    for t in c.prefill_lengths:
        calls = {
            name: bench.prefill_call(cfg, params[name], t, c)
            for name, cfg in cfgs.items()
            if name != TRANSFORMER or t <= c.transformer_max_len
        }
        calls["floor"] = bench.prefill_call(cfgs[TRANSFORMER], params[TRANSFORMER], t, c, fn=floor)
        row = {"T": t, **bench.time_interleaved(calls, c.repeats)}
        for name, cfg in cfgs.items():
            if name in calls:
                row[f"{name}_gflop"] = flops.prefill_flops(cfg, t) / 1e9
        row["floor_gflop"] = flops.floor_prefill_flops(cfgs[ORTHROS], t) / 1e9
        row["orthros_over_floor"] = bench.ratio(row[ORTHROS], row["floor"])
        if TRANSFORMER in row:
            row["speedup"] = bench.ratio(row[TRANSFORMER], row[ORTHROS])
            row["flop_ideal_speedup"] = row[f"{TRANSFORMER}_gflop"] / row[f"{ORTHROS}_gflop"]
            row["speedup_fraction_of_ideal"] = row["speedup"] / row["flop_ideal_speedup"]
        rows.append(row)
        print(
            f"prefill T={t}: "
            + json.dumps({k: v for k, v in row.items() if not isinstance(v, dict)}),
            flush=True,
        )
    results["prefill"] = rows


def honesty_suite(c, cfgs, params, results) -> None:
    cfg = cfgs[TRANSFORMER]
    dense = bench.dense_prefill(cfg)
    rows = []
    for t in [t for t in c.prefill_lengths if t <= c.dense_max_len]:
        calls = {
            TRANSFORMER: bench.prefill_call(cfg, params[TRANSFORMER], t, c),
            "dense_dot_product_attention": bench.prefill_call(
                cfg, params[TRANSFORMER], t, c, fn=dense
            ),
        }
        row = {"T": t, **bench.time_interleaved(calls, c.repeats)}
        row["ours_over_dense"] = bench.ratio(row[TRANSFORMER], row["dense_dot_product_attention"])
        rows.append(row)
        print(f"honesty T={t}: ours/dense = {row['ours_over_dense']:.3f}", flush=True)
    results["honesty"] = rows


def memory_suite(c, cfgs, params, results) -> None:
    rows = []
    for t in c.prefill_lengths:
        row = {"T": t}
        for name in (ORTHROS, TRANSFORMER):
            cfg = cfgs[name]
            cache = jax.eval_shape(lambda cfg=cfg: init_cache(cfg, c.batch_size, t))
            tokens = jax.ShapeDtypeStruct((c.batch_size, t), jnp.int32)
            lengths = jax.ShapeDtypeStruct((c.batch_size,), jnp.int32)
            temp = prefill_jit.lower(params[name], cache, tokens, lengths, cfg=cfg).compile()
            analysis = temp.memory_analysis()
            resident = bench.tree_bytes(cache) + bench.tree_bytes(params[name])
            row[name] = {
                "temp_bytes": int(analysis.temp_size_in_bytes) if analysis else None,
                "cache_plus_params_bytes": resident,
            }
            if analysis:
                row[name]["temp_over_resident"] = analysis.temp_size_in_bytes / resident
        rows.append(row)
        print(f"memory T={t}: " + json.dumps(row), flush=True)
    results["memory"] = rows


def decode_suite(c, cfgs, params, results) -> None:
    rows = []
    for ctx in c.decode_contexts:
        row = bench.decode_row(cfgs, params, ctx, c)
        row["orthros_over_transformer"] = bench.ratio(row[ORTHROS], row[TRANSFORMER])
        rows.append(row)
        print(f"decode ctx={ctx}: " + json.dumps(row), flush=True)
    results["decode"] = rows


def train_suite(c, cfgs, params, results) -> None:
    t = c.train_len
    tokens = jax.random.randint(jax.random.PRNGKey(2), (c.train_batch, t + 1), 0, 256)
    calls = {name: bench.pt_step_call(cfg, params[name], tokens) for name, cfg in cfgs.items()}
    row = {"T": t, **bench.time_interleaved(calls, c.repeats)}
    for name, cfg in cfgs.items():
        row[name]["gflop"] = 3 * flops.pt_forward_flops(cfg, t) * c.train_batch / 1e9
    row["time_ratio"] = bench.ratio(row[ORTHROS], row[TRANSFORMER])
    row["flop_ratio"] = row[ORTHROS]["gflop"] / row[TRANSFORMER]["gflop"]
    row["time_ratio_over_flop_ratio"] = row["time_ratio"] / row["flop_ratio"]
    print("train: " + json.dumps(row), flush=True)
    results["train"] = row


def _generate_call(cfg: ModelConfig, p, prompts: list, new_tokens: int, slots: int):
    return lambda: generate(p, prompts, cfg, max_new_tokens=new_tokens, cache_size=slots).tokens


def inference_suite(c, cfgs, params, results) -> None:
    """What a user of the serving API sees, per arm. TTFT: `prefill` of a c.inference_len-token
    prompt (host tokens in, padded to its bucket) until the first token id is on the host.
    Decode tokens/s two ways: `decode_step` one token at a time with a host round trip per
    token (as launch/generate.py streams), and `generate`'s on-device loop, whose per-token time
    is that of c.inference_new_tokens + 1 tokens minus that of 1 (an 8-token prompt, so its
    prefill is small). Both decode in caches of the same S slots; a decode step reads every
    slot (masked), so its cost is set by S, not by how many slots are filled."""
    t, n, bsz = c.inference_len, c.inference_new_tokens, c.batch_size
    slots = t + n * (c.repeats + 1)
    prompts, lengths = (np.asarray(x) for x in bench.prompt(cfgs[ORTHROS], t, c))
    first_token = jax.jit(lambda logits: jnp.argmax(logits, -1))
    calls = {}
    for name, cfg in cfgs.items():
        state = {
            "cache": init_cache(cfg, bsz, slots),
            "stream": bench.filled_cache(cfg, bsz, t, slots - t),
        }

        def ttft(cfg=cfg, name=name, state=state):
            logits, cache = prefill(params[name], state["cache"], prompts, lengths, cfg)
            token = np.asarray(first_token(logits))
            state["cache"] = cache.replace(lengths=jnp.zeros_like(cache.lengths))
            return token

        def stream(cfg=cfg, name=name, state=state):
            token = np.zeros((bsz,), np.int32)
            for _ in range(n):
                logits, state["stream"] = decode_step(params[name], state["stream"], token, cfg)
                token = np.asarray(first_token(logits))
            return token

        short = [list(row[:8]) for row in prompts]
        calls[f"{name}_ttft"] = ttft
        calls[f"{name}_decode_step"] = stream
        calls[f"{name}_generate_1"] = _generate_call(cfg, params[name], short, 1, slots)
        calls[f"{name}_generate_n"] = _generate_call(cfg, params[name], short, n + 1, slots)
    timing = bench.time_interleaved(calls, c.repeats)
    row = {"prompt_len": t, "new_tokens": n, "cache_slots": slots}
    for name in cfgs:
        loop = [
            (a - b) / n
            for a, b in zip(
                timing[f"{name}_generate_n"]["times_s"],
                timing[f"{name}_generate_1"]["times_s"],
                strict=True,
            )
        ]
        row[name] = {
            "ttft_s": timing[f"{name}_ttft"]["median_s"],
            "decode_step_tok_s": bsz * n / timing[f"{name}_decode_step"]["median_s"],
            # None if noise swamped the loop's time (too few new tokens for this machine).
            "generate_tok_s": bsz / step_s if (step_s := statistics.median(loop)) > 0 else None,
            "timing": {
                k.removeprefix(f"{name}_"): v for k, v in timing.items() if k.startswith(name)
            },
        }
    row["ttft_speedup"] = bench.ratio(timing["transformer_ttft"], timing["orthros_ttft"])
    brief = {
        k: {m: x for m, x in v.items() if m != "timing"} if isinstance(v, dict) else v
        for k, v in row.items()
    }
    print("inference: " + json.dumps(brief), flush=True)
    results["inference"] = row


def window_suite(c, cfgs, params, results) -> None:
    """The sliding-window attention kernel alone, per query block size (not in the default
    suites: a diagnosis of the Orthros / floor gap; run it pinned to one core with taskset to
    see whether the kernel uses more than one)."""
    del params
    cfg = cfgs[ORTHROS]
    calls = {
        f"block_{b}": bench.window_attention_layers(cfg, b, c.batch_size) for b in c.window_blocks
    }
    timing = bench.time_interleaved(calls, c.repeats)
    rows = [
        {"block": b, "ms_per_chunk_layer": 1e3 * timing[f"block_{b}"]["median_s"] / cfg.n_layers}
        for b in c.window_blocks
    ]
    print("window: " + json.dumps(rows), flush=True)
    results["window"] = rows


# name -> suite(c, cfgs, params, results), run in this order.
SUITE_FNS = {
    "prefill": prefill_suite,
    "honesty": honesty_suite,
    "memory": memory_suite,
    "decode": decode_suite,
    "train": train_suite,
    "inference": inference_suite,
    "speculative": spec_suite.speculative_suite,
    "window": window_suite,
    "sequence": bench_sequence.sequence_suite,
    "table4": bench_table4.table4_suite,
}
SUITES = tuple(SUITE_FNS)


def main(argv) -> None:
    del argv
    c = _CONFIG.value
    unknown = sorted(set(_SUITES.value) - set(SUITES))
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; valid: {', '.join(SUITES)}")
    if not _OUT.value:
        raise ValueError("--out is required (a directory for bench.json and the reports)")
    os.makedirs(_OUT.value, exist_ok=True)
    cfgs = arms(c)
    p = init_params(cfgs[ORTHROS], jax.random.PRNGKey(c.seed))
    params = {ORTHROS: p, TRANSFORMER: bench.drop_so(p, cfgs[ORTHROS])}
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(),
        "host": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "model": cfgs[ORTHROS].to_dict(),
        "command": " ".join(["python"] + sys.argv),
        "repeats": c.repeats,
        "batch_size": c.batch_size,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    t0 = time.time()
    for name, suite in SUITE_FNS.items():
        if name in _SUITES.value:
            suite(c, cfgs, params, results)
    results["wall_s"] = time.time() - t0
    written = write_report(results, _OUT.value)
    if "sequence" in results:
        written += bench_sequence.write_report(results, _OUT.value)
    if "table4" in results:
        written += bench_table4.write_report(results, _OUT.value)
    print(f"wrote {', '.join(written)} into {_OUT.value} in {results['wall_s']:.0f}s")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    cli.run(main, "benchmark.py")
