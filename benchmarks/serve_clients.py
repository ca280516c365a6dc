"""The load generator of benchmarks/serve_load.py: streamed greedy requests through the
OpenAI client (in a client process of its own), the engine + app it talks to, and the same
prompts submitted to the engine directly (no HTTP)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import statistics
import threading
import time

import openai

from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.serving.api import create_app
from orthros_jax.serving.background import BackgroundServer
from orthros_jax.serving.engine import Engine
from orthros_jax.serving.requests import SamplingParams

NAME = "bench"
TOK = ByteTokenizer()


async def _one(client, ids: list[int], new: int, t0: float) -> dict:
    """One streamed greedy request: its first-token and end times (from t0) and its tokens."""
    first, n = None, 0
    stream = await client.completions.create(
        model=NAME,
        prompt=ids,
        max_tokens=new,
        temperature=0,
        stream=True,
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        lp = chunk.choices[0].logprobs if chunk.choices else None
        got = len(lp.tokens) if lp and lp.tokens else 0
        if got and first is None:
            first = time.perf_counter() - t0
        n += got
    return {"ttft_s": first, "end_s": time.perf_counter() - t0, "tokens": n}


async def _burst(url: str, prompts: list[list[int]], new: int) -> dict:
    """All prompts sent at once; the batch's Table 4 metrics."""
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600
    ) as client:
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


def _burst_in_process(url: str, prompts: list[list[int]], new: int) -> dict:
    return asyncio.run(_burst(url, prompts, new))


class _Client:
    """The load generator's client in a process of its own (spawned once), so its HTTP and JSON
    work does not share the server's interpreter lock, as a real client would not."""

    def __init__(self) -> None:
        self.pool = None

    def burst(self, url: str, prompts: list[list[int]], new: int) -> dict:
        if self.pool is None:
            ctx = multiprocessing.get_context("spawn")
            self.pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx)
        return self.pool.submit(_burst_in_process, url, prompts, new).result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None


CLIENT = _Client()


def serve(
    cfg,
    params,
    *,
    slots: int,
    max_len: int,
    lengths: tuple[int, ...],
    batches=None,
    batch_wait_s: float = 0.0,
    decode_steps: int = 1,
    chunk_budget: int | None = None,
    **engine_kw,
):
    """An Engine (prefill buckets `lengths` x `batches`; chunk_budget: every slot's longest
    bucket by default; engine_kw: the rest of Engine's options, e.g. kv_cache_dtype) compiled
    by warmup, and a BackgroundServer over it. Returns (server, warm-up seconds, engine)."""
    engine = Engine(
        params,
        cfg,
        max_batch=slots,
        max_len=max_len,
        chunk_budget=chunk_budget or max(lengths) * slots,
        prefill_lengths=lengths,
        prefill_batches=batches,
        decode_text=TOK.decode,
        decode_steps=decode_steps,
        batch_wait_s=batch_wait_s,
        **engine_kw,
    )
    t = time.perf_counter()
    engine.warmup()
    return BackgroundServer(create_app(engine, TOK, NAME)), time.perf_counter() - t, engine


def direct(engine: Engine, prompts: list[list[int]], new: int) -> dict:
    """The prompts submitted to the engine itself at once (no HTTP): the engine's own overhead
    against generate. e2e: submit -> every request done; ttft: mean submit -> first token."""
    done, first = threading.Semaphore(0), {}
    greedy = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()

    def listen(k: int):
        def on_event(ev) -> None:
            if ev.kind == "token" and k not in first:
                first[k] = time.perf_counter() - t0
            elif ev.kind in ("done", "error"):
                done.release()

        return on_event

    for k, p in enumerate(prompts):
        engine.submit(p, greedy, listen(k))
    for _ in prompts:
        done.acquire()
    e2e = time.perf_counter() - t0
    return {
        "e2e_s": e2e,
        "ttft_s": statistics.mean(first.values()),
        "output_tok_s": len(prompts) * new / e2e,
    }
