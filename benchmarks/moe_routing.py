r"""Why paired routing matters, measured: an Orthros MoE arm with moe routing "paired" vs
"independent" on the same weights (docs/moe.md, "Paired routing, measured").

    python benchmarks/moe_routing.py --out=runs/moe_routing
    python benchmarks/moe_routing.py --out=/tmp/moer --layers=2 --experts=8 --repeats=3  # quick

The model: configs/bench.py's attention at --d_model wide and --layers layers, every FFN a
mixture of --experts SwiGLU experts of width --d_expert, --top_k per token, randomly
initialised (init_params, PRNGKey(0)): the routing decisions are an untrained router's.

  experts  per MoE layer of each decode step, the distinct experts the step's tokens (each
           row's new token and its output copy) are routed to, read from the routing the
           model computes (a debug callback on kernels/moe.experts), averaged over --steps
           greedy decode steps after a --prompt-token random prompt; x the bytes of one
           expert's three matrices = the expert weight bytes the step reads. Beside it the
           compiled decode step's cost_analysis()['bytes accessed'].
  time     decode step (batch 1 and 8, a cache filled to --context) and the PT train step
           (forward + backward, --train_len tokens), timed interleaved (benchmarks/common.py):
           the median over rounds of each round's independent / paired ratio.
Writes --out/moe_routing.json and moe_routing.md.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from orthros_jax import inference
from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import load_config_file
from orthros_jax.config.moe import ROUTINGS
from orthros_jax.inference import drivers
from orthros_jax.inference.cache import init_cache
from orthros_jax.kernels import moe as kmoe
from orthros_jax.model import Params, init_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import common as bench  # noqa: E402
from benchmarks.common import ORTHROS  # noqa: E402
from benchmarks.run_record import run_record  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_string("out", None, "Output directory.")
    flags.DEFINE_string("config", os.path.join(ROOT, "configs", "bench.py"), "Bench config.")
    flags.DEFINE_integer("d_model", 256, "Model width.")
    flags.DEFINE_integer("layers", 4, "Layers (every one MoE).")
    flags.DEFINE_integer("window", 32, "The base stream's window (below --prompt: copies differ).")
    flags.DEFINE_integer("experts", 16, "Experts per MoE layer.")
    flags.DEFINE_integer("top_k", 2, "Experts per token.")
    flags.DEFINE_integer("d_expert", 128, "Each expert's SwiGLU width.")
    flags.DEFINE_list("batches", ["1", "8"], "Decode batch sizes.")
    flags.DEFINE_integer("prompt", 128, "Prompt tokens before the counted decode steps.")
    flags.DEFINE_integer("steps", 8, "Counted decode steps (and decode steps per timed call).")
    flags.DEFINE_integer("context", 256, "Cache fill of the timed decode steps.")
    flags.DEFINE_integer("train_len", 256, "Tokens of the timed PT train step (batch 1).")
    flags.DEFINE_integer("repeats", 7, "Timed rounds.")


def moe_configs(
    model: Any, d_model: int, layers: int, window: int, moe: dict
) -> dict[str, ModelConfig]:
    """The two arms (paired, independent) of an Orthros MoE: `model` (a bench config's c.model)
    at width d_model (heads of 64), `layers` layers and `window`, every FFN the MoE `moe`."""
    shape = dict(d_model=d_model, n_layers=layers, n_heads=max(d_model // 64, 1), head_dim=64)
    shape |= dict(n_kv_heads=max(d_model // 128, 1), window=window, architecture=ORTHROS)
    arms = {r: shape | dict(moe=moe | dict(routing=r)) for r in ROUTINGS}
    return bench.model_configs(dict(model), arms)


def expert_bytes(cfg: ModelConfig) -> int:
    """Bytes of one expert's w_gate, w_up and w_down in the parameter dtype."""
    assert cfg.moe is not None
    return 3 * cfg.d_model * cfg.moe.d_expert * jnp.dtype(cfg.param_dtype).itemsize


@contextlib.contextmanager
def recorded_routing(log: list[np.ndarray]) -> Iterator[None]:
    """While active, programs traced call back with each MoE layer's experts [N, K] (each
    row's tokens, base then copies), appended to `log`."""
    original = kmoe.experts

    def experts(impl: str, *args: jax.Array, first: int | jax.Array = 0) -> jax.Array:
        jax.debug.callback(lambda e: log.append(np.asarray(e)), args[-1])
        return original(impl, *args, first=first)

    kmoe.experts = experts  # type: ignore[assignment]
    try:
        yield
    finally:
        kmoe.experts = original  # type: ignore[assignment]
        jax.effects_barrier()
        jax.clear_caches()  # no program traced under the patch is reused


def expert_reads(
    cfg: ModelConfig, params: Params, batch: int, prompt: int, steps: int, seed: int = 0
) -> dict[str, Any]:
    """The distinct experts each MoE layer of a decode step routes to (the new tokens and their
    copies: what the step's grouped matmul reads), averaged over `steps` greedy decode steps
    after a random `prompt`-token prompt per row; `base_experts`: the new tokens' own alone."""
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, prompt))
    cache = init_cache(cfg, batch, prompt + steps)
    logits, cache = inference.prefill(params, cache, tokens, np.full(batch, prompt), cfg)
    log: list[np.ndarray] = []
    active = jnp.ones((batch,), bool)
    with recorded_routing(log):
        step = jax.jit(functools.partial(drivers.decode, cfg=cfg))
        for _ in range(steps):
            logits, cache = step(params, cache, jnp.argmax(logits, -1).astype(jnp.int32), active)
        jax.block_until_ready(logits)
    assert len(log) == steps * cfg.n_layers and all(e.shape[0] == 2 * batch for e in log)
    union = [len(np.unique(e)) for e in log]
    # Each row's tokens are [its new token, its copy] (layers/moe.py joins the streams per row).
    base = [len(np.unique(e.reshape(batch, 2, -1)[:, 0])) for e in log]
    per_step = np.sum(np.reshape(union, (steps, -1)), axis=1) * expert_bytes(cfg)
    return {
        "batch": batch,
        "experts": float(np.mean(union)),
        "base_experts": float(np.mean(base)),
        "expert_bytes_per_step": float(np.mean(per_step)),
    }


def compiled_bytes(cfg: ModelConfig, params: Params, batch: int, context: int) -> float:
    """cost_analysis()['bytes accessed'] of the compiled decode step."""
    cache = init_cache(cfg, batch, context)
    tok, active = jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool)
    compiled = jax.jit(functools.partial(drivers.decode, cfg=cfg)).lower(params, cache, tok, active)
    cost = compiled.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["bytes accessed"])


def measure(
    cfgs: dict[str, ModelConfig],
    params: Params,
    batches: list[int],
    prompt: int,
    steps: int,
    context: int,
    train_len: int,
    repeats: int,
) -> dict[str, Any]:
    """Expert reads and times of both arms (cfgs: paired, independent) at `params`."""
    result: dict[str, Any] = {"expert_mib": expert_bytes(cfgs["paired"]) / 2**20, "decode": []}
    for b in batches:
        row: dict[str, Any] = {"batch": b}
        for name, cfg in cfgs.items():
            row[name] = expert_reads(cfg, params, b, prompt, steps)
            row[name]["compiled_bytes"] = compiled_bytes(cfg, params, b, context)
        c = types.SimpleNamespace(repeats=repeats, decode_steps=steps, batch_size=b)
        timing = bench.decode_row(cfgs, dict.fromkeys(cfgs, params), context, c)
        for name in cfgs:
            row[name]["step_s"] = timing[name]["step_s"]
        row["time_ratio"] = bench.ratio(timing["independent"], timing["paired"])
        result["decode"].append(row)
        print(json.dumps(row), flush=True)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (1, train_len + 1), 0, 256)
    calls = {n: bench.pt_step_call(cfg, params, tokens) for n, cfg in cfgs.items()}
    train = bench.time_interleaved(calls, repeats)
    result["train"] = {
        "T": train_len,
        **{n: {"step_s": train[n]["median_s"]} for n in cfgs},
        "time_ratio": bench.ratio(train["independent"], train["paired"]),
    }
    print(json.dumps(result["train"]), flush=True)
    return result


def markdown(result: dict[str, Any]) -> str:
    m, s = result["settings"], result["expert_mib"]
    lines = [
        f"d_model {m['d_model']}, {m['layers']} MoE layers of {m['experts']} experts, top-"
        f"{m['top_k']}, d_expert {m['d_expert']} ({s:.3f} MiB per expert), window "
        f"{m['window']}, random init; {m['steps']} decode steps after a {m['prompt']}-token "
        f"prompt; timed at context {m['context']}, {m['repeats']} rounds; {result['backend']}, "
        f"load {result['load']}, {result['date']}.",
        "",
        "| batch | routing | experts / MoE layer (base tokens' own) | expert MiB / step | "
        "compiled bytes accessed (MiB) | decode step (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["decode"]:
        for name in ROUTINGS:
            r = row[name]
            lines.append(
                f"| {row['batch']} | {name} | {r['experts']:.2f} ({r['base_experts']:.2f}) | "
                f"{r['expert_bytes_per_step'] / 2**20:.2f} | {r['compiled_bytes'] / 2**20:.2f} | "
                f"{r['step_s'] * 1e3:.3f} |"
            )
    lines.append("")
    lines.append("| step | independent / paired time (median of per-round ratios) |")
    lines.append("|---|---|")
    for row in result["decode"]:
        lines.append(f"| decode, batch {row['batch']} | {row['time_ratio']:.3f} |")
    t = result["train"]
    lines.append(f"| PT train, T={t['T']} | {t['time_ratio']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    del argv
    t0 = time.perf_counter()
    moe = dict(n_experts=FLAGS.experts, top_k=FLAGS.top_k, d_expert=FLAGS.d_expert)
    model = load_config_file(FLAGS.config).model
    cfgs = moe_configs(model, FLAGS.d_model, FLAGS.layers, FLAGS.window, moe)
    params = init_params(cfgs["paired"], jax.random.PRNGKey(0))
    settings = dict(d_model=FLAGS.d_model, layers=FLAGS.layers, experts=FLAGS.experts)
    settings |= dict(top_k=FLAGS.top_k, d_expert=FLAGS.d_expert, window=FLAGS.window)
    settings |= dict(prompt=FLAGS.prompt, train_len=FLAGS.train_len)
    settings |= dict(steps=FLAGS.steps, context=FLAGS.context, repeats=FLAGS.repeats)
    load = [round(x, 2) for x in os.getloadavg()]
    batches = [int(b) for b in FLAGS.batches]
    args = (FLAGS.prompt, FLAGS.steps, FLAGS.context, FLAGS.train_len, FLAGS.repeats)
    result = measure(cfgs, params, batches, *args)
    result |= dict(settings=settings, backend=jax.default_backend(), load=load)
    result["load_end"] = [round(x, 2) for x in os.getloadavg()]
    result["date"] = datetime.date.today().isoformat()
    result |= run_record(t0)
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, "moe_routing.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(FLAGS.out, "moe_routing.md"), "w") as f:
        f.write(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["out"])
    app.run(main)
