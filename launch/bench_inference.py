r"""Inference timing: TTFT (prefill + first token) and decode tokens/s per architecture.

    python launch/bench_inference.py --archs=orthros,transformer --prompt_len=8192

Random weights and tokens (timing does not depend on them). Every figure is measured after
a warm-up call with the same shapes, so compilation is excluded; each is the median of
--repeats runs. Decode is measured two ways: step by step through `decode_step` (a host
round trip per token, as launch/generate.py streams) and inside `generate`'s on-device loop
(from a prefilled cache: the time of max_new_tokens=N+1 minus that of max_new_tokens=1).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from orthros_jax import inference as inf
from orthros_jax.config import ModelConfig
from orthros_jax.model import init_params

FLAGS = flags.FLAGS
flags.DEFINE_list("archs", ["orthros", "transformer"], "Architectures to time.")
flags.DEFINE_integer("prompt_len", 8192, "Prompt tokens.")
flags.DEFINE_integer("new_tokens", 32, "Decode steps timed.")
flags.DEFINE_integer("batch", 1, "Rows (all with the full prompt length).")
flags.DEFINE_integer("repeats", 3, "Timed runs per figure (median reported).")
flags.DEFINE_integer("d_model", 256, "Width.")
flags.DEFINE_integer("n_layers", 4, "Layers.")
flags.DEFINE_integer("n_heads", 4, "Query heads (head_dim = d_model / n_heads).")
flags.DEFINE_integer("n_kv_heads", 2, "KV heads.")
flags.DEFINE_integer("window", 128, "Orthros/SWA window.")
flags.DEFINE_integer("prefill_chunk", 2048, "Prefill chunk.")
flags.DEFINE_string("dtype", "float32", "Activation and cache dtype.")


def bench(arch: str) -> dict[str, float]:
    cfg = ModelConfig(
        vocab_size=256, d_model=FLAGS.d_model, n_layers=FLAGS.n_layers, n_heads=FLAGS.n_heads,
        n_kv_heads=FLAGS.n_kv_heads, head_dim=FLAGS.d_model // FLAGS.n_heads,
        d_ff=3 * FLAGS.d_model, window=FLAGS.window, architecture=arch,
        scale_offset=arch == "orthros", prefill_chunk=FLAGS.prefill_chunk, dtype=FLAGS.dtype,
    )  # fmt: skip
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    b, t, n = FLAGS.batch, FLAGS.prompt_len, FLAGS.new_tokens
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t))
    size = t + n + 2
    first = jax.jit(lambda logits: jnp.argmax(logits, -1))

    def ttft():
        cache = jax.block_until_ready(inf.init_cache(cfg, b, size))
        t0 = time.perf_counter()
        logits, cache = inf.prefill(params, cache, prompts, [t] * b, cfg)
        token = np.asarray(first(logits))
        return time.perf_counter() - t0, cache, token

    ttft()  # compile
    runs = [ttft() for _ in range(FLAGS.repeats)]
    out = {"ttft_s": statistics.median(r[0] for r in runs)}

    _, cache, token = runs[-1]
    logits, cache = inf.decode_step(params, cache, token, cfg)  # compile

    # generate's on-device loop from this prefilled cache (a fresh copy per run, since the
    # loop donates it): M tokens cost M-1 decode steps, so (T(N+1) - T(1)) / N is one step.
    stops = jnp.full((b, 1), -1, jnp.int32)

    def loop(m: int) -> float:
        fresh = jax.block_until_ready(jax.tree.map(jnp.copy, cache))
        t0 = time.perf_counter()
        jax.block_until_ready(
            inf._generate_jit(
                params,
                fresh,
                logits,
                jax.random.PRNGKey(0),
                stops,
                cfg=cfg,
                sampler=inf.Sampler(),
                max_new_tokens=m,
            )  # fmt: skip
        )
        return time.perf_counter() - t0

    loop_s = [loop(m) for m in (1, n + 1)]  # compile both
    loop_s = [statistics.median(loop(m) for _ in range(FLAGS.repeats)) for m in (1, n + 1)]
    out["loop_tok_s"] = b * n / (loop_s[1] - loop_s[0])

    # decode_step one token at a time, with a host round trip per token (as generate.py).
    token = np.asarray(first(logits))
    t0 = time.perf_counter()
    for _ in range(n):
        logits, cache = inf.decode_step(params, cache, token, cfg)
        token = np.asarray(first(logits))
    out["step_tok_s"] = b * n / (time.perf_counter() - t0)
    return out


def main(argv: list[str]) -> None:
    del argv
    print(
        f"{jax.devices()[0].platform} | prompt {FLAGS.prompt_len} x batch {FLAGS.batch} | "
        f"d_model {FLAGS.d_model}, {FLAGS.n_layers} layers, window {FLAGS.window}, "
        f"chunk {FLAGS.prefill_chunk}, {FLAGS.dtype}"
    )
    print(f"{'arch':<12} {'TTFT s':>8} {'decode_step tok/s':>18} {'generate loop tok/s':>20}")
    for arch in FLAGS.archs:
        r = bench(arch)
        print(
            f"{arch:<12} {r['ttft_s']:>8.3f} {r['step_tok_s']:>18.1f} {r['loop_tok_s']:>20.1f}",
            flush=True,
        )


if __name__ == "__main__":
    app.run(main)
