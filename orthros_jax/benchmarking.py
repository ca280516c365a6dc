"""Pieces of the prefill benchmark (launch/benchmark.py) that compare like with like.

Besides the library's own `inference.prefill`, the benchmark times two references built from
the same per-layer functions and the same cache writes:
  floor_prefill  the token-wise floor: attention replaced by identity (o = q), chunked like
                 `prefill`. No architecture can prefill faster than this.
  dense_prefill  the Transformer arm with `jax.nn.dot_product_attention` over the whole prompt
                 at once (T x T scores): the baseline's honesty check.
Both return (logits [B, V], cache) like `prefill`; dense_prefill's logits equal the
Transformer arm's (tested), so the comparison is of speed only.
`window_attention_layers` isolates the base stream's sliding-window attention of one prefill
chunk (what Orthros pays over the floor) to time its kernel on its own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from orthros_jax import kv_cache as kvc
from orthros_jax import layers as L
from orthros_jax.attention import local_attention
from orthros_jax.cached_forward import logits_of
from orthros_jax.config import ModelConfig
from orthros_jax.kv_cache import KVCache
from orthros_jax.model import Params, layer_finish, layer_kv, layer_query


def _layer(params: Params, i: int) -> Params:
    return jax.tree.map(lambda a: a[i], params["layers"])


def _stack(params: Params, n: int) -> Params:
    return jax.tree.map(lambda a: a[:n], params["layers"])


def _prefill_with(
    attend: Callable[[jax.Array, jax.Array, jax.Array], jax.Array], chunk: int, cfg: ModelConfig
):
    """A prefill of full-length prompts [B, T] whose layers use `attend(q, k, v)` per chunk."""

    def run(params: Params, cache: KVCache, tokens: jax.Array) -> tuple[jax.Array, KVCache]:
        bsz, t = tokens.shape
        c = min(chunk, t)
        n = cfg.n_layers

        def run_chunk(carry, ci):
            ck, cv, _ = carry
            pos = jnp.broadcast_to(ci * c + jnp.arange(c, dtype=jnp.int32), (bsz, c))
            x = L.embed(
                jax.lax.dynamic_slice_in_dim(tokens, ci * c, c, 1),
                params["embedding"],
                cfg.jnp_dtype,
            )

            def layer(carry, xs):
                x, ck, cv = carry
                p, li = xs
                k, v = layer_kv(p, x, pos, cfg)
                ck, cv = kvc.write(ck, li, pos, k), kvc.write(cv, li, pos, v)
                q = layer_query(p, x, pos, cfg, "base")
                return (layer_finish(p, x, attend(q, k, v), cfg), ck, cv), None

            (x, ck, cv), _ = jax.lax.scan(
                layer, (x, ck, cv), (_stack(params, n - 1), jnp.arange(n - 1))
            )
            k, v = layer_kv(_layer(params, n - 1), x, pos, cfg)
            ck, cv = kvc.write(ck, n - 1, pos, k), kvc.write(cv, n - 1, pos, v)
            return (ck, cv, x[:, -1:]), None

        x0 = jnp.zeros((bsz, 1, cfg.d_model), cfg.jnp_dtype)
        (ck, cv, x_last), _ = jax.lax.scan(run_chunk, (cache.k, cache.v, x0), jnp.arange(t // c))
        # The last layer runs for the last token only (its K/V are already in the cache).
        p = _layer(params, n - 1)
        pos = jnp.full((bsz, 1), t - 1, jnp.int32)
        k_all, v_all = (jnp.swapaxes(kvc.layer_view(a, n - 1)[:, :, :t], 1, 2) for a in (ck, cv))
        q = layer_query(p, x_last, pos, cfg, "base")
        x_last = layer_finish(p, x_last, _last_token_attend(attend, q, k_all, v_all), cfg)
        lengths = jnp.full((bsz,), t, jnp.int32)
        return logits_of(params, x_last[:, 0], cfg), KVCache(ck, cv, lengths)

    return run


def _last_token_attend(attend, q, k_all, v_all):
    if attend is _identity:
        return q
    return jax.nn.dot_product_attention(q, k_all, v_all)  # one query sees every key


def _identity(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return q


def _dense_causal(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def floor_prefill(cfg: ModelConfig) -> Callable[..., tuple[jax.Array, KVCache]]:
    """Jitted token-wise floor prefill(params, cache, tokens [B, T]) (T a multiple of the chunk)."""
    return jax.jit(_prefill_with(_identity, cfg.prefill_chunk, cfg), donate_argnums=(1,))


def dense_prefill(cfg: ModelConfig) -> Callable[..., tuple[jax.Array, KVCache]]:
    """Jitted Transformer prefill with dense `jax.nn.dot_product_attention` over the whole prompt."""
    return jax.jit(_prefill_with(_dense_causal, 1 << 30, cfg), donate_argnums=(1,))


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
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree))
