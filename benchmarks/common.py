"""Pieces of the benchmark (launch/benchmark.py; its report: benchmarks/report.py) that compare
like with like.

Besides the library's own `inference.prefill`, the benchmark times two references that are
the same prefill driver with another attention implementation (layers/attend.py):
  floor_prefill  the token-wise floor: attention replaced by identity (o = q), chunked like
                 `prefill`. No architecture can prefill faster than this.
  dense_prefill  the Transformer arm with `jax.nn.dot_product_attention` over the whole prompt
                 at once (T x T scores): the baseline's honesty check.
Both return (logits [B, V], cache) like `prefill`; dense_prefill's logits equal the
Transformer arm's (tested), so the comparison is of speed only.
`window_attention_layers` isolates the base stream's sliding-window attention of one prefill
chunk (what Orthros pays over the floor) to time its kernel on its own; `decode_row`
times every arm's decode steps on a `filled_cache` (suites decode and table4) and
`pt_step_call` a PT step's forward + backward. Shared by the suites: `model_configs` (the
arms' configs), `drop_so` (a single-stream arm's weights from its two-stream partner's),
`prompt` and `prefill_call` (the timed prefill of a full prompt).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orthros_jax import inference
from orthros_jax.config import ModelConfig
from orthros_jax.config.architectures import TWO_STREAM_FORM
from orthros_jax.config.cli import to_plain
from orthros_jax.convert.common import own_arm
from orthros_jax.inference.cache import KVCache, init_cache
from orthros_jax.inference.drivers import prefill
from orthros_jax.kernels.attention import local_attention
from orthros_jax.layers import attention, flops, gdn
from orthros_jax.layers.attend import AttentionImpl, Keys
from orthros_jax.layers.registry import kinds_of
from orthros_jax.layers.stack import so_names
from orthros_jax.model import OrthrosLM, Params

# The arms the benchmarks compare, found in the arms table by their kinds: the single-stream
# attention-only arm (the Transformer) and its two-stream conversion (Orthros); the GDN and
# attention hybrid and its two-stream conversion (Orthros-H).
TRANSFORMER = own_arm(attention.KIND.name)
ORTHROS = TWO_STREAM_FORM[TRANSFORMER]
HYBRID = own_arm(gdn.KIND.name, attention.KIND.name)
ORTHROS_H = TWO_STREAM_FORM[HYBRID]


def model_configs(model: Any, arms: dict[str, dict[str, Any]]) -> dict[str, ModelConfig]:
    """One ModelConfig per arm: the `model` mapping (a config's c.model) updated by the arm's
    fields, in bfloat16 on accelerators (as given on CPU). Nested sections (kinds, moe) may be
    ConfigDicts."""
    base = dict(to_plain(model))
    if jax.default_backend() != "cpu":
        base.update(dtype="bfloat16", param_dtype="bfloat16")
    return {name: ModelConfig.from_dict(base | dict(fields)) for name, fields in arms.items()}


def drop_so(params: Params, cfg: ModelConfig) -> Params:
    """A two-stream model's (cfg's) weights without its scale-offset vectors (each kind's, by
    stack.so_names): the single-stream arm that shares every other weight."""
    out = dict(params)
    for kind in kinds_of(cfg):
        drop = set(so_names(kind, cfg))
        out[kind.params_key] = {n: a for n, a in params[kind.params_key].items() if n not in drop}
    return out


def floor(
    q: jax.Array,
    q_pos: jax.Array,
    q_seg: jax.Array,
    keys: Keys,
    window: int | None,
    cfg: ModelConfig,
) -> jax.Array:
    """The token-wise floor as an attention implementation (attend.AttentionImpl): o = q, no
    attention at all. Not a model: what no architecture can prefill faster than."""
    return q


def prompt(cfg: ModelConfig, t: int, c: Any) -> tuple[jax.Array, jax.Array]:
    """The benchmark's prompt of t tokens: c.batch_size rows of random ids drawn from
    PRNGKey(c.seed), each row full (lengths t)."""
    tokens = jax.random.randint(jax.random.PRNGKey(c.seed), (c.batch_size, t), 0, cfg.vocab_size)
    return tokens, jnp.full((c.batch_size,), t, jnp.int32)


def prefill_call(
    cfg: ModelConfig,
    params: Params,
    t: int,
    c: Any,
    *,
    fn: Callable[..., tuple[jax.Array, KVCache]] | None = None,
    fresh_cache: bool = False,
    mesh: Any = None,
) -> Callable[[], jax.Array]:
    """A no-argument call of one prefill of the t-token `prompt` into a t-slot cache, returning
    the logits: the public `inference.prefill` (host token ids in, as a server gets them), or
    fn(params, cache, tokens) (floor_prefill, dense_prefill). The cache is donated and reused,
    emptied, by the next call; with fresh_cache every call gets a new one instead (a GDN state
    would carry over into the next prompt). mesh: split the cache over it (sequence-parallel)."""
    tokens, lengths = prompt(cfg, t, c)
    host = np.asarray(tokens), np.asarray(lengths)
    new_cache = lambda: init_cache(cfg, c.batch_size, t, mesh=mesh)
    state = {"cache": None if fresh_cache else new_cache()}

    def call() -> jax.Array:
        cache = new_cache() if fresh_cache else state["cache"]
        if fn is None:
            logits, cache = inference.prefill(params, cache, *host, cfg)
        else:
            logits, cache = fn(params, cache, tokens)
        if not fresh_cache:
            state["cache"] = cache.replace(lengths=jnp.zeros_like(cache.lengths))
        return logits

    return call


def _full_prompt_prefill(
    cfg: ModelConfig, impl: AttentionImpl | str
) -> Callable[..., tuple[jax.Array, KVCache]]:
    def run(params: Params, cache: KVCache, tokens: jax.Array) -> tuple[jax.Array, KVCache]:
        lengths = jnp.full((tokens.shape[0],), tokens.shape[1], jnp.int32)
        return prefill(params, cache, tokens, lengths, cfg=cfg, impl=impl)

    return jax.jit(run, donate_argnums=(1,))


def floor_prefill(cfg: ModelConfig) -> Callable[..., tuple[jax.Array, KVCache]]:
    """Jitted token-wise floor prefill(params, cache, tokens [B, T]) (T a multiple of the chunk):
    the library's prefill driver with the attention implementation `floor` (o = q)."""
    return _full_prompt_prefill(cfg, floor)


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
                acc,
                k,
                v,
                q_positions=pos,
                k_positions=pos,
                window=w,
                prefix=prefix,
                block_size=block,
            )
            return acc + o.astype(acc.dtype)

        return jax.lax.fori_loop(0, cfg.n_layers, layer, q)

    return lambda: run(q)


def filled_cache(cfg: ModelConfig, bsz: int, context: int, room: int) -> KVCache:
    """A cache holding `context` random K/V entries per row and `room` free slots (decode cost
    does not depend on the values; a GDN state stays zero)."""
    cache = init_cache(cfg, bsz, context + room)
    states = dict(cache.states)
    for kind in kinds_of(cfg):
        if not kind.recurrent:  # K/V over slots: random entries (a recurrent state stays 0)
            keys = jax.random.split(jax.random.PRNGKey(1), len(jax.tree.leaves(states[kind.name])))
            leaves, tree = jax.tree.flatten(states[kind.name])
            leaves = [
                0.1 * jax.random.normal(r, a.shape, a.dtype)
                for r, a in zip(keys, leaves, strict=True)
            ]
            states[kind.name] = jax.tree.unflatten(tree, leaves)
    return cache.replace(states=states, lengths=jnp.full((bsz,), context, jnp.int32))


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
                logits, state["cache"] = inference.decode_step(
                    params[name], state["cache"], tok, cfg
                )
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


def pt_step_call(cfg: ModelConfig, params: Params, tokens: jax.Array) -> Callable[[], Any]:
    """A no-argument call of one jitted PT step's forward + backward (value_and_grad of the mean
    next-token loss of tokens [B, T + 1]) of cfg's model at params."""

    def loss(p: Params) -> jax.Array:
        logits = OrthrosLM(cfg).apply({"params": p}, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    step = jax.jit(jax.value_and_grad(loss))
    return lambda: step(params)


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


def cache_bytes_per_token(
    cfg: ModelConfig, kv_cache_dtype: str | None = None, dtype: str | None = None
) -> float:
    """Bytes of one cache position over every layer's state, from the real cache's shapes
    (init_cache under eval_shape: nothing is allocated); dtype: the model dtype's default."""
    s = 4096
    shape = jax.eval_shape(lambda: init_cache(cfg, 1, s, dtype, kv_cache_dtype=kv_cache_dtype))
    return tree_bytes(shape.states) / s
