"""Pieces of the benchmark (launch/benchmark.py; its report: bench_report.py) that compare like
with like.

Besides the library's own `inference.prefill`, the benchmark times two references that are
the same prefill driver with another attention implementation (attend.py):
  floor_prefill  the token-wise floor: attention replaced by identity (o = q), chunked like
                 `prefill`. No architecture can prefill faster than this.
  dense_prefill  the Transformer arm with `jax.nn.dot_product_attention` over the whole prompt
                 at once (T x T scores): the baseline's honesty check.
Both return (logits [B, V], cache) like `prefill`; dense_prefill's logits equal the
Transformer arm's (tested), so the comparison is of speed only.
`window_attention_layers` isolates the base stream's sliding-window attention of one prefill
chunk (what Orthros pays over the floor) to time its kernel on its own; `decode_row`
times every arm's decode steps on a `filled_cache` (suites decode and table4).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from orthros_jax import flops
from orthros_jax.attention import local_attention
from orthros_jax.cached_forward import prefill
from orthros_jax.config import ModelConfig
from orthros_jax.inference import decode_step
from orthros_jax.kv_cache import KVCache, init_cache
from orthros_jax.model import Params


def _full_prompt_prefill(cfg: ModelConfig, impl: str):
    def run(params: Params, cache: KVCache, tokens: jax.Array) -> tuple[jax.Array, KVCache]:
        lengths = jnp.full((tokens.shape[0],), tokens.shape[1], jnp.int32)
        return prefill(params, cache, tokens, lengths, cfg=cfg, impl=impl)

    return jax.jit(run, donate_argnums=(1,))


def floor_prefill(cfg: ModelConfig) -> Callable[..., tuple[jax.Array, KVCache]]:
    """Jitted token-wise floor prefill(params, cache, tokens [B, T]) (T a multiple of the chunk):
    the library's prefill driver with the attention implementation "floor" (o = q)."""
    return _full_prompt_prefill(cfg, "floor")


def dense_prefill(cfg: ModelConfig) -> Callable[..., tuple[jax.Array, KVCache]]:
    """Jitted Transformer prefill with dense `jax.nn.dot_product_attention` over the whole prompt
    (one chunk: T x T scores)."""
    return _full_prompt_prefill(cfg.replace(prefill_chunk=1 << 30), "dot_product")


def window_attention_layers(cfg: ModelConfig, block: int, batch: int) -> Callable[[], jax.Array]:
    """A no-argument call of `local_attention` over one prefill chunk (cfg.prefill_chunk
    queries, the previous W-1 keys as prefix, query block `block`), repeated for cfg.n_layers
    layers inside one jitted loop, as prefill runs it. Random inputs: timing only."""
    c, w, h, n, kv = cfg.prefill_chunk, cfg.window, cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    q = jax.random.normal(keys[0], (batch, c, n, h), cfg.jnp_dtype)
    k, v = (jax.random.normal(x, (batch, c, kv, h), cfg.jnp_dtype) for x in keys[1:3])
    pk, pv = (jax.random.normal(x, (batch, w - 1, kv, h), cfg.jnp_dtype) for x in keys[3:5])
    pos = jnp.broadcast_to(w + jnp.arange(c, dtype=jnp.int32), (batch, c))
    pre = jnp.broadcast_to(1 + jnp.arange(w - 1, dtype=jnp.int32), (batch, w - 1))
    prefix = (pk, pv, pre, jnp.ones_like(pre))

    @jax.jit
    def run(q: jax.Array) -> jax.Array:
        def layer(_, acc):  # acc feeds the next query: the layers cannot be merged or hoisted
            o = local_attention(
                acc, k, v, q_positions=pos, k_positions=pos, window=w, prefix=prefix,
                block_size=block,
            )  # fmt: skip
            return acc + o.astype(acc.dtype)

        return jax.lax.fori_loop(0, cfg.n_layers, layer, q)

    return lambda: run(q)


def filled_cache(cfg: ModelConfig, bsz: int, context: int, room: int) -> KVCache:
    """A cache holding `context` random K/V entries per row and `room` free slots (decode cost
    does not depend on the values; a GDN state stays zero)."""
    cache = init_cache(cfg, bsz, context + room)
    k = 0.1 * jax.random.normal(jax.random.PRNGKey(1), cache.k.shape, cache.k.dtype)
    v = 0.1 * jax.random.normal(jax.random.PRNGKey(2), cache.v.shape, cache.v.dtype)
    return cache.replace(k=k, v=v, lengths=jnp.full((bsz,), context, jnp.int32))


def decode_row(
    cfgs: dict[str, ModelConfig], params: dict[str, Params], context: int, c: Any
) -> dict[str, Any]:
    """Decode step time of every arm at one context, timed interleaved: each call is
    c.decode_steps steps continuing on one cache filled to `context` (batch c.batch_size).
    Returns {"context", arm: {"step_s", "times_s", "gflop"}}; `ratio` compares two arms."""
    rounds, steps, bsz = c.repeats + 1, c.decode_steps, c.batch_size  # +1: the warm-up call
    tok = jnp.zeros((bsz,), jnp.int32)

    def call_for(name: str, cfg: ModelConfig) -> Callable[[], jax.Array]:
        state = {"cache": filled_cache(cfg, bsz, context, steps * rounds)}

        def call() -> jax.Array:
            for _ in range(steps):
                logits, state["cache"] = decode_step(params[name], state["cache"], tok, cfg)
            return logits

        return call

    timing = time_interleaved({n: call_for(n, cfg) for n, cfg in cfgs.items()}, c.repeats)
    row: dict[str, Any] = {"context": context}
    for name, cfg in cfgs.items():
        row[name] = {
            "step_s": timing[name]["median_s"] / steps,
            "times_s": timing[name]["times_s"],
            "gflop": flops.decode_flops(cfg, context) / 1e9,
        }
    return row


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict]:
    """Wall times in seconds of several calls measured side by side: one warm-up call each
    (it compiles), then `repeats` rounds that call each in turn, so the slow drifts of a shared
    machine hit every call alike. Returns, per name, {"median_s", "min_s", "repeats",
    "times_s" (one per round)}; `ratio` compares two of them round by round."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {
        name: {"median_s": statistics.median(t), "min_s": min(t), "repeats": repeats, "times_s": t}
        for name, t in times.items()
    }


def ratio(a: dict, b: dict) -> float:
    """Median over rounds of a's time / b's time, for two entries of one `time_interleaved`."""
    return statistics.median(x / y for x, y in zip(a["times_s"], b["times_s"], strict=True))


def tree_bytes(tree: Any) -> int:
    """Bytes held by every array leaf of a pytree (arrays or ShapeDtypeStructs)."""
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree))
