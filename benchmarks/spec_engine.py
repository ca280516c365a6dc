r"""Speculative decoding through the serving engine (continuous batching), plain against
speculative, side by side in one run: decode tokens/s while every slot decodes.

    python benchmarks/spec_engine.py --out=/tmp/spec_engine \
        --speed_models=orthros=/tmp/spec_long_orthros,transformer=/tmp/spec_long_transformer \
        --contexts=16384 --batch=8 --requests=16 --new=64 --temperature=1.0

Why beside benchmarks/spec_timing.py (generate's loops): `generate` runs its batch until the
slowest row is done, so at batch B a speculative loop takes as many rounds as its unluckiest
row while its mean row needed fewer. The engine frees a slot as soon as its request ends and
admits the next one, which is how a server runs speculation at batch > 1.

Each (arm, context): --requests prompts of `context` bytes (benchmarks/speculative.py's
held-out slices), each asking --new tokens (ignore_eos, seeded per request), submitted at once to
an engine of --batch slots; the engine is stepped on this thread until every request is done,
once plain (--plain_steps decode steps per call) and once speculative (k = --speed_k, draft
window w, --spec_rounds rounds per call), alternating for --repeats rounds after a warm-up run
each. Counted: the steps that prefill nothing while all --batch slots decode (what a step of
a full, steady server does); decode tok/s = tokens they emit / their time. The ratio is the
median over rounds of the per-round ratio (a shared machine's drift hits both alike).

Writes --out/spec_engine.json (every number) and spec_engine.md (the table).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

import numpy as np
from absl import app, flags

from orthros_jax.config import ModelConfig
from orthros_jax.inference import Speculative
from orthros_jax.model import Params
from orthros_jax.serving.engine import Engine
from orthros_jax.serving.events import Event
from orthros_jax.serving.requests import SamplingParams

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks import spec_timing  # noqa: E402

FLAGS = flags.FLAGS


class _CountingEngine(Engine):
    """An Engine that notes, per step, whether it prefilled and how many slots it decoded."""

    prefilled: bool = False
    decoded_rows: int = 0

    def _run_prefill(self, chunks: list[tuple[int, int]]) -> Any:
        self.prefilled = True
        return super()._run_prefill(chunks)

    def _run_decode(self, decoding: list[int]) -> Any:
        self.decoded_rows = len(decoding)
        return super()._run_decode(decoding)


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One engine run. tokens: every request's tokens, in submission order; counted_tokens /
    counted_s / counted_steps: the full decode-only steps'; steps / wall_s: all of the run's;
    rounds / drafted / accepted / emitted: the engine's speculation counters (0 when plain)."""

    tokens: list[list[int]]
    counted_tokens: int
    counted_s: float
    counted_steps: int
    steps: int
    wall_s: float
    rounds: int
    drafted: int
    accepted: int
    emitted: int

    @property
    def decode_tok_s(self) -> float:
        return self.counted_tokens / self.counted_s if self.counted_s > 0 else float("nan")

    @property
    def tokens_per_verify(self) -> float:
        return self.emitted / max(1, self.rounds)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(1, self.drafted)


def engine_for(
    params: Params,
    cfg: ModelConfig,
    *,
    batch: int,
    max_len: int,
    steps: int,
    spec: Speculative | None,
    chunk: int,
) -> _CountingEngine:
    """A compiled engine of `batch` slots of max_len (warmup run: nothing compiles while timed);
    steps: decode steps (plain) or rounds (speculative) per decode call; chunk: prompt tokens
    per row and prefill step, whose one shape is [batch, chunk] with a budget of batch * chunk
    tokens: rows admitted together prefill together, so they decode together (equal prompts
    always fill it; one shape compiles once)."""
    engine = _CountingEngine(
        params,
        cfg,
        max_batch=batch,
        max_len=max_len,
        chunk_budget=batch * chunk,
        max_queue=1 << 16,
        prefill_lengths=(chunk,),
        prefill_batches=(batch,),
        decode_steps=steps,
        speculative=spec,
    )
    engine.warmup()
    return engine


def run_engine(
    engine: _CountingEngine, prompts: np.ndarray, *, new: int, temperature: float
) -> EngineRun:
    """Submits every prompt [N, T] at once (request i seeded i, ignore_eos, `new` tokens) and
    steps the engine until all are done."""
    got: list[list[int]] = [[] for _ in prompts]
    errors: list[str] = []

    def listener(i: int) -> Any:
        def on_event(e: Event) -> None:
            if e.kind == "token" and e.token is not None:
                got[i].append(e.token)
            elif e.kind == "error":  # the engine guards its listeners: noted, raised below
                errors.append(f"request {i}: {e.error}")

        return on_event

    m = engine.metrics
    spec0 = (m.spec_rounds, m.spec_drafted, m.spec_accepted, m.spec_emitted)
    for i, p in enumerate(prompts):
        params = SamplingParams(max_tokens=new, temperature=temperature, seed=i, ignore_eos=True)
        engine.submit([int(t) for t in p], params, listener(i))
    counted_tokens, counted_s, counted_steps, steps = 0, 0.0, 0, 0
    t_start = time.perf_counter()
    while engine.busy():
        engine.prefilled, engine.decoded_rows = False, 0
        before, t = m.generated, time.perf_counter()
        engine.step()  # returns after reading the tokens back: the step's device work is done
        dt = time.perf_counter() - t
        steps += 1
        if not engine.prefilled and engine.decoded_rows == engine.max_batch:
            counted_tokens += m.generated - before
            counted_s += dt
            counted_steps += 1
    wall = time.perf_counter() - t_start
    if errors:
        raise RuntimeError(f"run_engine: {len(errors)} requests failed, first {errors[0]}")
    spec1 = (m.spec_rounds, m.spec_drafted, m.spec_accepted, m.spec_emitted)
    rounds, drafted, accepted, emitted = (b - a for a, b in zip(spec0, spec1, strict=True))
    return EngineRun(
        got,
        counted_tokens,
        counted_s,
        counted_steps,
        steps,
        wall,
        rounds,
        drafted,
        accepted,
        emitted,
    )


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_string("out", None, "Directory for spec_engine.json / .md.")
    flags.DEFINE_list("speed_models", [], "Trained models as arm=directory (load_model).")
    flags.DEFINE_list("contexts", ["16384"], "Prompt lengths (bytes of held-out text).")
    flags.DEFINE_integer("batch", 8, "Engine slots.")
    flags.DEFINE_integer("requests", 16, "Requests per run (more than --batch: slots refill).")
    flags.DEFINE_integer("new", 64, "Tokens per request.")
    flags.DEFINE_integer("speed_k", 4, "Drafts per round (draft window: the model's window).")
    flags.DEFINE_integer("plain_steps", 8, "Plain decode steps per engine decode call.")
    flags.DEFINE_integer("spec_rounds", 2, "Speculative rounds per engine decode call.")
    flags.DEFINE_float("temperature", 1.0, "Sampling temperature (0: greedy, checked identical).")
    flags.DEFINE_integer("repeats", 2, "Timed rounds of plain then speculative.")


def measure(arm: str, cfg: ModelConfig, params: Params, context: int) -> dict:
    """One (arm, context) row: plain and speculative engines, interleaved."""
    prompts = spec_timing.held_out_prompts(context, FLAGS.requests)
    spec = Speculative(FLAGS.speed_k, cfg.window)
    max_len = spec_timing.cache_slots(context, FLAGS.new, spec)
    kw = dict(batch=FLAGS.batch, max_len=max_len, chunk=cfg.prefill_chunk)
    engines = {
        "plain": engine_for(params, cfg, steps=FLAGS.plain_steps, spec=None, **kw),
        "speculative": engine_for(params, cfg, steps=FLAGS.spec_rounds, spec=spec, **kw),
    }
    runs: dict[str, list[EngineRun]] = {name: [] for name in engines}
    for r in range(FLAGS.repeats + 1):  # the first: a warm-up run of each
        for name, engine in engines.items():
            run = run_engine(engine, prompts, new=FLAGS.new, temperature=FLAGS.temperature)
            print(f"{arm} {context} {name} run {r}: {run.decode_tok_s:.1f} tok/s", flush=True)
            if r:
                runs[name].append(run)
    plain, specs = runs["plain"], runs["speculative"]
    ratios = [s.decode_tok_s / p.decode_tok_s for p, s in zip(plain, specs, strict=True)]
    last = specs[-1]
    row = dict(arm=arm, context=context, batch=FLAGS.batch, requests=FLAGS.requests)
    row.update(
        new=FLAGS.new,
        k=spec.k,
        draft_window=spec.draft_window,
        temperature=FLAGS.temperature,
        plain_tok_s=statistics.median(p.decode_tok_s for p in plain),
        spec_tok_s=statistics.median(s.decode_tok_s for s in specs),
        ratio=statistics.median(ratios),
        ratios=ratios,
        tokens_per_verify=last.tokens_per_verify,
        acceptance_rate=last.acceptance_rate,
        counted_steps=f"plain {plain[-1].counted_steps}/{plain[-1].steps}, "
        f"speculative {last.counted_steps}/{last.steps}",
    )
    if FLAGS.temperature == 0:  # greedy: the same tokens, request by request
        row["identical"] = plain[-1].tokens == last.tokens
    return row


def main(argv: list[str]) -> None:
    del argv
    if not FLAGS.speed_models:
        raise ValueError("--speed_models: give arm=directory of at least one trained model")
    if FLAGS.requests <= FLAGS.batch:
        raise ValueError(f"--requests must exceed --batch ({FLAGS.batch}) so that slots refill")
    os.makedirs(FLAGS.out, exist_ok=True)
    rows = []
    for arm, cfg, params in spec_timing.trained_models(FLAGS.speed_models):
        for context in map(int, FLAGS.contexts):
            rows.append(measure(arm, cfg, params, context))
            print(rows[-1], flush=True)
    with open(os.path.join(FLAGS.out, "spec_engine.json"), "w") as f:
        json.dump({"rows": rows, "argv": sys.argv}, f, indent=1)
    md = spec_timing.table(rows, skip=("ratios",))
    with open(os.path.join(FLAGS.out, "spec_engine.md"), "w") as f:
        f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["out"])
    app.run(main)
