r"""The KV wall (issue 28): a quantized KV cache and prefix caching, measured.

    python benchmarks/kv_prefix.py --out=runs/kv_prefix
    python benchmarks/kv_prefix.py --out=/tmp/kvp --contexts=4096 --turns=4 --system=512  # quick

  memory   cache bytes per token (every layer's K/V, scales included) of the bench model
           (configs/bench.py) in float32 / bfloat16 / int8, and the largest max_batch x max_len
           (= tokens) that fits --memory_gib.
  decode   one decode step (inference.decode_step, batch 1) on a cache filled to each of
           --contexts, full precision vs int8, timed interleaved (benchmarks.common).
  chat     --conversations concurrent scripted chats of --turns turns through the server (the
           engine + OpenAI app, streamed): a --system-token system prompt, then per turn a
           --user-token message and a --answer-token reply; each turn resends the whole
           conversation. TTFT per turn with and without prefix caching, Orthros and Transformer
           (the bench model's width at --chat_layers layers). Then the shared-prompt workload:
           --clients requests at once, one --system-token prefix, short questions.
Writes --out/kv_prefix.json and kv_prefix.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import openai
from absl import app, flags

from orthros_jax import inference
from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import load_config_file
from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.model import init_params
from orthros_jax.serving.api import create_app
from orthros_jax.serving.background import BackgroundServer
from orthros_jax.serving.engine import Engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import common as bench  # noqa: E402
from benchmarks.common import ORTHROS, TRANSFORMER  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_string("out", None, "Output directory.")
    flags.DEFINE_string("config", os.path.join(ROOT, "configs", "bench.py"), "Bench config.")
    flags.DEFINE_float("memory_gib", 16.0, "Memory for the cache in the capacity table.")
    flags.DEFINE_list("contexts", ["4096", "16384"], "Decode contexts.")
    flags.DEFINE_integer("repeats", 5, "Timed decode calls per arm.")
    flags.DEFINE_integer("steps", 8, "Decode steps per timed call.")
    flags.DEFINE_integer("turns", 8, "Turns of each scripted chat.")
    flags.DEFINE_integer("conversations", 3, "Concurrent chats.")
    flags.DEFINE_integer("system", 2048, "System prompt tokens.")
    flags.DEFINE_integer("user", 32, "Tokens of each user message.")
    flags.DEFINE_integer("answer", 16, "Tokens of each reply.")
    flags.DEFINE_integer("clients", 8, "Requests of the shared-prompt workload.")
    flags.DEFINE_integer("chat_layers", 2, "Layers of the chat model (the bench model's width).")


TOK = ByteTokenizer()


def memory(cfg) -> dict:
    out = {}
    for name, dtype, kv in (
        ("float32", "float32", None),
        ("bfloat16", "bfloat16", None),
        ("int8", "bfloat16", "int8"),
    ):
        per_token = bench.cache_bytes_per_token(cfg, kv, dtype)
        out[name] = {
            "bytes_per_token": per_token,
            "tokens_in_memory": int(FLAGS.memory_gib * 2**30 // per_token),
        }
    return out


def _filled(cfg, context: int, room: int, kv: str | None):
    cache = inference.init_cache(cfg, 1, context + room, kv_cache_dtype=kv)
    key = iter(jax.random.split(jax.random.PRNGKey(1), 64))

    def fill(a):
        if jnp.issubdtype(a.dtype, jnp.integer):
            return jax.random.randint(next(key), a.shape, -127, 128).astype(a.dtype)
        scale = 0.001 if kv and a.ndim == 4 else 0.1  # an int8 cache's scales: 4-d
        return (scale * jax.random.normal(next(key), a.shape)).astype(a.dtype)

    cache = cache.replace(states=jax.tree.map(fill, cache.states))
    return cache.replace(lengths=jnp.full((1,), context, jnp.int32))


def decode(cfg, params, contexts: list[int]) -> list[dict]:
    rows = []
    tok = jnp.zeros((1,), jnp.int32)
    for t in contexts:
        room = FLAGS.steps * (FLAGS.repeats + 1)
        calls = {}
        for kv in (None, "int8"):
            state = {"cache": _filled(cfg, t, room, kv)}

            def call(state=state):
                for _ in range(FLAGS.steps):
                    logits, state["cache"] = inference.decode_step(params, state["cache"], tok, cfg)
                return logits

            calls[kv or "full"] = call
        timing = bench.time_interleaved(calls, FLAGS.repeats)
        row = {"context": t}
        for name in calls:
            row[name] = timing[name]["median_s"] / FLAGS.steps
        row["int8/full"] = row["int8"] / row["full"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# Replies in ASCII: their text re-encodes to the very tokens the server generated (a byte >= 128
# alone decodes to U+FFFD, 3 bytes), so each turn resends the conversation the cache holds.
ASCII_ONLY = {str(i): -100.0 for i in range(128, 256)}


async def _ttft(client, prompt: list[int], new: int) -> tuple[float, list[int]]:
    t0 = time.perf_counter()
    first, text = None, ""
    stream = await client.completions.create(
        model="m",
        prompt=prompt,
        max_tokens=new,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
        logit_bias=ASCII_ONLY,
    )
    async for chunk in stream:
        if first is None:
            first = time.perf_counter() - t0
        text += chunk.choices[0].text if chunk.choices else ""
    return first or 0.0, TOK.encode(text)


def chat(cfg, params, prefix_caching: bool) -> dict:
    rng = np.random.default_rng(0)
    system = rng.integers(0, 256, FLAGS.system).tolist()
    users = rng.integers(0, 256, (FLAGS.conversations, FLAGS.turns, FLAGS.user)).tolist()
    max_len = FLAGS.system + FLAGS.turns * (FLAGS.user + FLAGS.answer) + 64
    engine = Engine(
        params,
        cfg,
        max_batch=max(FLAGS.conversations, FLAGS.clients),
        max_len=max_len,
        chunk_budget=512,
        prefill_lengths=(64, 512),
        prefix_caching=prefix_caching,
        decode_text=TOK.decode,
    )
    engine.warmup()
    with BackgroundServer(create_app(engine, TOK, "m")) as server:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=600
        )

        async def conversation(c: int) -> list[float]:
            history, out = list(system), []
            for turn in range(FLAGS.turns):
                history += users[c][turn]
                ttft, answer = await _ttft(client, history, FLAGS.answer)
                history += answer
                out.append(ttft)
            return out

        async def shared() -> list[float]:
            qs = rng.integers(0, 256, (FLAGS.clients, 16)).tolist()
            got = await asyncio.gather(*(_ttft(client, system + q, 4) for q in qs))
            return [t for t, _ in got]

        async def main():
            per_conv = await asyncio.gather(*(conversation(c) for c in range(FLAGS.conversations)))
            await _ttft(client, system + [1], 1)  # the system prompt is in some row (or not)
            return per_conv, await shared()

        per_conv, shared_ttft = asyncio.run(main())
    turns = [statistics.mean(conv[t] for conv in per_conv) for t in range(FLAGS.turns)]
    m = engine.metrics
    return {
        "ttft_per_turn_s": turns,
        "shared_prompt_ttft_s": statistics.mean(shared_ttft),
        "prefix_queries": m.prefix_lookups,
        "prefix_hits": m.prefix_hits,
        "reused_tokens": m.prefix_reused,
    }


def main(argv: list[str]) -> None:
    del argv
    os.makedirs(FLAGS.out, exist_ok=True)
    base = load_config_file(FLAGS.config)
    cfg = ModelConfig(**dict(base.model))
    result: dict = {"uptime": os.getloadavg(), "memory": memory(cfg)}
    print(json.dumps(result["memory"]), flush=True)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    result["decode"] = decode(cfg, params, [int(x) for x in FLAGS.contexts])
    result["chat"] = {}
    for arch in (ORTHROS, TRANSFORMER):
        small = ModelConfig(
            **(
                dict(base.model)
                | dict(architecture=arch, n_layers=FLAGS.chat_layers, scale_offset=arch == ORTHROS)
            )
        )
        p = jax.jit(init_params, static_argnums=0)(small, jax.random.PRNGKey(0))
        for pc in (False, True):
            key = f"{arch}/{'prefix' if pc else 'no_prefix'}"
            result["chat"][key] = chat(small, p, pc)
            print(key, json.dumps(result["chat"][key]), flush=True)
    result["uptime_end"] = os.getloadavg()
    with open(os.path.join(FLAGS.out, "kv_prefix.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(FLAGS.out, "kv_prefix.md"), "w") as f:
        f.write(_markdown(result))
    print(_markdown(result))


def _markdown(r: dict) -> str:
    lines = [f"| cache | bytes/token | tokens in {FLAGS.memory_gib:g} GiB |", "|---|---|---|"]
    lines += [
        f"| {k} | {v['bytes_per_token']:.0f} | {v['tokens_in_memory']:,} |"
        for k, v in r["memory"].items()
    ]
    lines += ["", "| context | full ms/step | int8 ms/step | int8/full |", "|---|---|---|---|"]
    lines += [
        f"| {d['context']} | {1e3 * d['full']:.2f} | {1e3 * d['int8']:.2f} | {d['int8/full']:.2f} |"
        for d in r["decode"]
    ]
    lines += [
        "",
        "| arm / prefix caching | TTFT per turn (s) | shared-prompt TTFT (s) | reused tokens |",
        "|---|---|---|---|",
    ]
    for k, v in r["chat"].items():
        turns = " ".join(f"{t:.2f}" for t in v["ttft_per_turn_s"])
        lines.append(f"| {k} | {turns} | {v['shared_prompt_ttft_s']:.2f} | {v['reused_tokens']} |")
    lines += ["", f"load (uptime) at start {r['uptime']}, end {r['uptime_end']}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["out"])
    app.run(main)
