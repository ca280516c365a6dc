r"""Self-speculative decoding (orthros_jax/inference/speculative.py), Orthros against the
Transformer arm's MagicDec-style self-speculation, side by side in one run.

    python benchmarks/speculative.py --out=runs/speculative --model=/tmp/spec_tiny
    python benchmarks/speculative.py --out=/tmp/spec_small --suites=speed --contexts=1024,2048

Suites:
  lossless    greedy speculative == plain greedy, token for token, on --prompts ragged prompts
              (stop id, max_new_tokens) for both arms at k in --ks (random weights at the
              default job's shape, the output stream's scale-offsets randomized).
  acceptance  mean accepted length (tokens per verify) of the trained --model (a training
              workdir or exported model, e.g. the default job's) on --prompts prompts from the
              embedded corpus, for k in --ks x draft_window in --window_multiples x w (a model
              with draft scale-offsets drafts with them: compare it with its base model).
  speed       decode tokens/s, plain and speculative (k = --speed_k, draft window w), at each
              context in --contexts and batch in --batches, timed by
              benchmarks/spec_timing.time_loops (launch/benchmark.py's suite "speculative"
              too: plain and speculative interleaved over one cache, the ratio the median of
              the per-repeat ratios), with the acceptance (tokens per verify) of the same
              run. With --speed_models (arm=model, e.g. the two arms of configs/spec_long.py):
              each trained model on real prompts, slices of the embedded corpus's held-out
              documents prefilled to the context, greedy output checked identical to plain.
              Without: both arms at the bench shape (configs/bench.py) with random weights
              over a cache of random K/V (no prefill; they accept almost nothing), and the
              ratio projected at the 'acceptance' suite's a, labelled.
Through the serving engine (continuous batching, no batch waiting for its slowest row):
benchmarks/spec_engine.py.
Writes --out/speculative.json (every number) and speculative.md (the tables).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import load_config_file
from orthros_jax.inference import Speculative, generate, init_cache
from orthros_jax.inference import api as inference_api
from orthros_jax.inference.sampling import Sampler
from orthros_jax.model import init_params

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks import common as bench  # noqa: E402
from benchmarks import spec_timing  # noqa: E402
from benchmarks.common import ORTHROS, TRANSFORMER  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_string("out", None, "Directory for speculative.json / .md.")
    flags.DEFINE_list("suites", ["lossless", "acceptance", "speed"], "Suites to run.")
    flags.DEFINE_string("model", None, "Trained model for 'acceptance' (load_model).")
    flags.DEFINE_list("ks", ["2", "4", "8"], "Drafts per round.")
    flags.DEFINE_list("window_multiples", ["1", "2", "4"], "'acceptance': draft windows / w.")
    flags.DEFINE_integer("prompts", 64, "Prompts of 'lossless' and 'acceptance'.")
    flags.DEFINE_integer("new", 32, "New tokens per prompt.")
    flags.DEFINE_integer("prompt_len", 160, "'acceptance': prompt bytes.")
    flags.DEFINE_list("contexts", ["1024", "2048", "4096", "8192"], "'speed' contexts.")
    flags.DEFINE_list("batches", ["1", "8"], "'speed' batch sizes.")
    flags.DEFINE_integer("speed_k", 4, "'speed': drafts per round.")
    flags.DEFINE_list("arms", [ORTHROS, TRANSFORMER], "'speed': arms to time.")
    flags.DEFINE_integer("repeats", 3, "'speed': timed runs (the median is kept).")
    flags.DEFINE_float(
        "temperature",
        0.0,
        "'speed': sampling temperature (0: greedy, output checked identical to plain; > 0: "
        "the speculative-sampling rule, acceptance without greedy's repetition loops).",
    )
    flags.DEFINE_list(
        "speed_models",
        [],
        "'speed': trained models as arm=directory (load_model), timed on held-out prompts; "
        "empty: the bench shape's random weights.",
    )


STOP = 10  # a byte that ends a line: rows stop at different places


def _random_model(cfg: ModelConfig, seed: int = 0) -> Any:
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(seed))
    if cfg.two_streams:  # the output stream differs from the base stream, as after training
        layers = dict(params["layers"])
        for i, name in enumerate(sorted(n for n in layers if n.startswith("so_"))):
            noise = jax.random.normal(jax.random.PRNGKey(seed + i), layers[name].shape)
            layers[name] = layers[name] + 0.5 * noise
        params = {**params, "layers": layers}
    return params


def _arms(config: str) -> dict[str, ModelConfig]:
    """Orthros and the Transformer arm at a config file's model shape."""
    transformer = dict(architecture=TRANSFORMER, scale_offset=False)
    return bench.model_configs(
        load_config_file(config).model, {ORTHROS: {}, TRANSFORMER: transformer}
    )


def _acceptance_row(stats: Any, k: int, emitted: np.ndarray) -> dict:
    """Mean accepted length (tokens per verify), the drafts' acceptance rate, and the ceiling of
    the former (every draft accepted: the budget's last round is short)."""
    rounds = -(-(emitted - 1) // (k + 1))
    ceiling = float((emitted - 1).sum() / max(1, rounds.sum()))
    rate = stats.acceptance_rate()
    return dict(mean_accepted=stats.tokens_per_verify(), acceptance_rate=rate, ceiling=ceiling)


def lossless(results: dict) -> None:
    rs = np.random.RandomState(0)
    prompts = [list(rs.randint(0, 256, size=rs.randint(1, 64))) for _ in range(FLAGS.prompts)]
    for arm, cfg in _arms("configs/tiny_pt.py").items():
        params = _random_model(cfg)
        kw = dict(max_new_tokens=FLAGS.new, stop_tokens=[STOP])
        plain = generate(params, prompts, cfg, **kw)
        for k in map(int, FLAGS.ks):
            out = generate(params, prompts, cfg, speculative=Speculative(k, cfg.window), **kw)
            same = bool((out.tokens == plain.tokens).all() and (out.lengths == plain.lengths).all())
            row = dict(arm=arm, k=k, prompts=len(prompts), identical=same)
            row["mean_accepted"] = out.speculation.tokens_per_verify()
            results["lossless"].append(row)
            print(row, flush=True)
            assert same, f"{arm} k={k}: speculative greedy differs from plain greedy"


def acceptance(results: dict) -> None:
    from orthros_jax.checkpoint import load_model
    from orthros_jax.data.corpus import embedded_documents

    loaded = load_model(FLAGS.model)
    cfg, params = loaded.cfg, jax.device_put(loaded.params)
    docs = [d.text.encode() for d in embedded_documents() if d.id.startswith("pydoc/")]
    rs = np.random.RandomState(1)
    prompts = []
    for i in rs.choice(len(docs), FLAGS.prompts, replace=len(docs) < FLAGS.prompts):
        text = docs[i]
        start = rs.randint(0, max(1, len(text) - FLAGS.prompt_len))
        prompts.append(list(text[start : start + FLAGS.prompt_len]) or [32])
    plain = generate(params, prompts, cfg, max_new_tokens=FLAGS.new)
    for k in map(int, FLAGS.ks):
        for mult in map(int, FLAGS.window_multiples):
            spec = Speculative(k, mult * cfg.window)
            out = generate(params, prompts, cfg, max_new_tokens=FLAGS.new, speculative=spec)
            row = dict(k=k, draft_window=spec.draft_window, window_multiple=mult)
            row["draft_so"] = cfg.draft_scale_offset
            row.update(_acceptance_row(out.speculation, k, out.lengths))
            row["identical"] = bool((out.tokens == plain.tokens).all())
            results["acceptance"].append(row)
            print(row, flush=True)


def _speed_arms() -> list[tuple[str, ModelConfig, Any, bool]]:
    """(arm, cfg, params, trained) of each arm to time: --speed_models, else the bench shape's
    random weights."""
    if not FLAGS.speed_models:
        arms = _arms("configs/bench.py").items()
        return [(a, cfg, _random_model(cfg), False) for a, cfg in arms if a in FLAGS.arms]
    return [
        (arm, cfg, params, True)
        for arm, cfg, params in spec_timing.trained_models(FLAGS.speed_models)
    ]


def speed(results: dict) -> None:
    new, k = FLAGS.new, FLAGS.speed_k
    batches = sorted(map(int, FLAGS.batches))
    sampler = Sampler(temperature=FLAGS.temperature)
    for arm, cfg, params, trained in _speed_arms():
        spec = Speculative(k, cfg.window)
        for context in map(int, FLAGS.contexts):
            prompts = spec_timing.held_out_prompts(context, batches[-1]) if trained else None
            slots = spec_timing.cache_slots(context, new, spec)
            for batch in batches:
                if prompts is None:
                    logits = jnp.zeros((batch, cfg.vocab_size), jnp.float32)
                    cache = bench.filled_cache(cfg, batch, context, slots - context)
                else:
                    lens = np.full((batch,), context)
                    t0 = time.perf_counter()
                    logits, cache = inference_api.prefill(
                        params, init_cache(cfg, batch, slots), prompts[:batch], lens, cfg
                    )
                    cache = jax.block_until_ready(cache)
                    print(f"{arm} {context}x{batch} prefill {time.perf_counter() - t0:.1f}s")
                t = spec_timing.time_loops(
                    params,
                    cache,
                    logits,
                    cfg,
                    spec,
                    new_tokens=new,
                    repeats=FLAGS.repeats,
                    sampler=sampler,
                )
                del cache  # donated to the loops; its last copy was freed with them
                row = dict(
                    arm=arm, context=context, batch=batch, k=k, draft_window=spec.draft_window
                )
                row.update(
                    trained=trained,
                    temperature=FLAGS.temperature,
                    plain_tok_s=t.plain_tok_s,
                    spec_tok_s=t.spec_tok_s,
                    mean_accepted=t.stats.tokens_per_verify(),
                    acceptance_rate=t.stats.acceptance_rate(),
                    round_over_step=t.round_over_step,
                    slowest_row_rounds=t.slowest_row_rounds,
                )
                row["measured_ratio"] = t.measured_ratio
                row["identical"] = t.identical  # None when sampled: other draws
                results["speed"].append(row)
                print(row, flush=True)


def project(results: dict) -> None:
    """Adds the projected ratio at the trained model's acceptance (k = speed_k, window w)."""
    acc = [
        r["mean_accepted"]
        for r in results["acceptance"]
        if r["k"] == FLAGS.speed_k and r["window_multiple"] == 1
    ]
    for row in results["speed"]:
        if acc and not row["trained"]:
            row["projected_ratio_at_trained_acceptance"] = acc[0] / row["round_over_step"]


def main(argv: list[str]) -> None:
    del argv
    os.makedirs(FLAGS.out, exist_ok=True)
    results: dict = {"lossless": [], "acceptance": [], "speed": [], "argv": sys.argv}
    suites = {"lossless": lossless, "acceptance": acceptance, "speed": speed}
    for name in FLAGS.suites:
        suites[name](results)
    project(results)
    with open(os.path.join(FLAGS.out, "speculative.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = [f"## {name}\n\n{spec_timing.table(results[name])}\n" for name in suites if results[name]]
    with open(os.path.join(FLAGS.out, "speculative.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["out"])
    app.run(main)
