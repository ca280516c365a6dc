r"""Where cached decode's time goes on CPU: the plain and the speculative generate loops
profiled thunk by thunk, and the per-layer K/V copy out of the stacked cache A/B-tested.

    python benchmarks/decode_profile.py --out=runs/decode_profile --model=/tmp/spec_long_orthros
    python benchmarks/decode_profile.py --out=/tmp/dp --contexts=1024 --batch=2 --suites=profile

Suites:
  profile  at each context in --contexts: the plain generate loop (--new tokens) and the
           speculative one (k = --k, draft window w) of --model (load_model; default: the bench
           shape of --config with random weights) over a cache of random K/V filled to the
           context, --batch rows. Each loop is compiled once, timed (--repeats untraced calls,
           the median), then run once under `jax.profiler.trace`; every thunk of that run is
           attributed to its instruction of the compiled HLO and sorted into a part
           (benchmarks/hlo_profile.py: the layer-slice copies of the K/V and of the weights,
           the attention dots over the cache, other ops over the slots, the rest). The
           speculative loop's thunks are split into the k draft steps' scan, the rest of the
           round (the verify pass and acceptance) and what runs outside the rounds. Beside
           them, one draft step and one plain decode step as standalone jitted calls (a cache
           passed in and out), wall against the sum of their thunks.
  slices   the attention of 1 and k + 1 queries over one layer of a cache, --reads times in
           one jitted call, four ways, timed interleaved (benchmarks/layer_slices.py): the
           layer read by a traced index out of a stacked [layers, B, K, S, H] cache (as
           stack.layer_loop reads it), by a static index, block by block (the library's CPU
           read, blocks of attention_block_cache_kib), and from separate per-layer buffers; at
           the model's K, H and N heads, --batch rows, S = each context. Per variant the
           layer and block copies found in its compiled HLO and its temporary bytes. With
           --aot_targets (e.g. h100x1, v5e:2x2; benchmarks/aot.target_devices), the stacked
           read compiled for each target at --aot_context in bfloat16, nothing run.
Writes --out/decode_profile.json (every number) and decode_profile.md (the tables).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import load_config_file
from orthros_jax.inference import Speculative, drivers
from orthros_jax.inference import api as inference_api
from orthros_jax.inference import speculative as spec_lib
from orthros_jax.inference.sampling import Sampler
from orthros_jax.layers.registry import kinds_of
from orthros_jax.model import init_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import common as bench  # noqa: E402
from benchmarks import hlo_profile, layer_slices  # noqa: E402
from benchmarks.aot import GPU_TARGET, TARGETS_HELP, TPU_TARGET  # noqa: E402
from benchmarks.hlo_profile import Part  # noqa: E402
from benchmarks.run_record import run_record  # noqa: E402

FLAGS = flags.FLAGS
DRAFT_MARKER = "draft_step"  # speculative._round's scanned draft step, in the HLO's op_names


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_string("out", None, "Directory for decode_profile.json / .md.")
    flags.DEFINE_list("suites", ["profile", "slices"], "Suites to run.")
    flags.DEFINE_string("model", None, "Trained model (load_model); default: random weights.")
    flags.DEFINE_string("config", os.path.join(ROOT, "configs", "bench.py"), "Shape w/o --model.")
    flags.DEFINE_list("contexts", ["1024", "16384"], "Cache tokens per row.")
    flags.DEFINE_integer("batch", 8, "Rows.")
    flags.DEFINE_integer("k", 4, "'profile': drafts per round; 'slices': k + 1 queries.")
    flags.DEFINE_integer("new", 33, "'profile': new tokens per loop (new - 1 decode steps).")
    flags.DEFINE_integer("repeats", 3, "Timed calls (the median is kept).")
    flags.DEFINE_integer("reads", 12, "'slices': layer reads per timed call.")
    flags.DEFINE_list("aot_targets", [], "'slices': targets to compile the stacked read for.")
    flags.DEFINE_integer("aot_context", 131072, "'slices': S of the compiled-only reads.")


@dataclasses.dataclass(frozen=True)
class Settings:
    """A run's sizes (the flags of the same names)."""

    contexts: tuple[int, ...] = (1024, 16384)
    batch: int = 8
    k: int = 4
    new: int = 33
    repeats: int = 3
    reads: int = 12
    aot_targets: tuple[str, ...] = ()
    aot_context: int = 131072

    def __post_init__(self) -> None:
        for name, least in (("batch", 1), ("k", 1), ("repeats", 1), ("reads", 1), ("new", 2)):
            if getattr(self, name) < least:
                raise ValueError(f"--{name} must be >= {least}, got {getattr(self, name)}")
        for t in self.aot_targets:
            if not (TPU_TARGET.match(t) or GPU_TARGET.match(t)):
                raise ValueError(f"--aot_targets: unknown target {t!r}; allowed: {TARGETS_HELP}")
        if not self.contexts or min(self.contexts) < 1:
            raise ValueError(f"--contexts must be positive token counts, got {self.contexts}")


def _median_ms(fn: Callable[[], Any], make: Callable[[], tuple], repeats: int) -> float:
    """Median wall ms of fn(*make()) over `repeats` calls after one warm-up (make untimed)."""
    times = []
    for i in range(repeats + 1):
        args = jax.block_until_ready(make())
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        if i:
            times.append(1e3 * (time.perf_counter() - t0))
        del args
    return statistics.median(times)


def _traced(compiled: Any, args: tuple) -> tuple[Any, dict[str, list[float]]]:
    """compiled(*args) run once under jax.profiler.trace: (its output, its thunk times)."""
    module = hlo_profile.Module.of(compiled).name
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            out = jax.block_until_ready(compiled(*args))
        return out, hlo_profile.thunk_times(trace_dir, module)


@dataclasses.dataclass(frozen=True)
class Layout:
    """What hlo_profile.classify is told of a program: the dims of the stacked cache leaves and
    of the stacked layer weights, and the cache's slot count S."""

    cache: frozenset[tuple[int, ...]]
    weights: frozenset[tuple[int, ...]]
    slots: int

    @classmethod
    def of(cls, cfg: ModelConfig, params: Any, cache: Any) -> Layout:
        weights = [params[kind.params_key] for kind in kinds_of(cfg)]
        return cls(
            frozenset(tuple(a.shape) for a in jax.tree.leaves(cache.states)),
            frozenset(tuple(a.shape) for a in jax.tree.leaves(weights)),
            cache.max_len,
        )

    def classify(self, module: hlo_profile.Module) -> dict[str, Part]:
        return hlo_profile.classify(module, set(self.cache), set(self.weights), {self.slots})


def _slots(context: int, room: int, params: Any) -> int:
    """Cache slots: context + room rounded up to 128, moved on until no weight has that axis
    (the profile finds the attention by its slot axes)."""
    taken = {d for a in jax.tree.leaves(params) for d in a.shape}
    slots = -(-(context + room) // 128) * 128
    while slots in taken:
        slots += 128
    return slots


def _total(parts: dict[str, dict[str, float]]) -> float:
    return sum(p["ms"] for p in parts.values())


def _profile_loop(
    name: str, fn: Any, kw: dict, make: Callable[[], tuple], layout: Layout, s: Settings
) -> tuple[dict, Any]:
    t0 = time.perf_counter()
    compiled = fn.lower(*make(), **kw).compile()
    row: dict[str, Any] = {"loop": name, "compile_s": time.perf_counter() - t0}
    row["wall_ms"] = _median_ms(compiled, make, s.repeats)
    out, times = _traced(compiled, make())
    module = hlo_profile.Module.of(compiled)
    parts = layout.classify(module)
    row["parts"] = hlo_profile.sum_parts(module, parts, times, None)
    row["thunks_ms"] = _total(row["parts"])
    row["top"] = hlo_profile.top_thunks(module, parts, times)
    row["kv_copies"] = sorted(
        (n, module.instructions[n].dims, p.value)
        for n, p in parts.items()
        if p in (Part.KV_COPY, Part.KV_BLOCK)
    )
    return row, (module, parts, times, out)


def _standalone(
    cfg: ModelConfig, params: Any, make_cache: Callable, draft: int | None, s: Settings
) -> dict:
    """One jitted decode step (a draft step with draft_window=draft) as its own call: wall ms
    (median) and the sum of its thunks (one traced call)."""
    batch = s.batch
    step = jax.jit(functools.partial(drivers.decode, cfg=cfg, draft_window=draft), donate_argnums=1)
    tok, act = jnp.zeros((batch,), jnp.int32), jnp.ones((batch,), bool)
    make = lambda: (params, make_cache(), tok, act)  # noqa: E731
    compiled = step.lower(*make()).compile()
    wall = _median_ms(compiled, make, s.repeats)
    _, times = _traced(compiled, make())
    module = hlo_profile.Module.of(compiled)
    parts = Layout.of(cfg, params, make_cache()).classify(module)
    return {
        "wall_ms": wall,
        "thunks_ms": _total(hlo_profile.sum_parts(module, parts, times, None)),
        "top": hlo_profile.top_thunks(module, parts, times, 4),
    }


def profile(results: dict, cfg: ModelConfig, params: Any, s: Settings) -> None:
    batch, k, new = s.batch, s.k, s.new
    spec = Speculative(k, cfg.window)
    for context in s.contexts:
        slots = _slots(context, new + k + 1, params)
        make_cache = functools.partial(bench.filled_cache, cfg, batch, context, slots - context)
        layout = Layout.of(cfg, params, make_cache())
        logits = jnp.zeros((batch, cfg.vocab_size), jnp.float32)
        stops = jnp.full((batch, 1), -1, jnp.int32)
        make = lambda: (params, make_cache(), logits, jax.random.PRNGKey(0), stops)  # noqa: E731
        common = dict(cfg=cfg, sampler=Sampler(), max_new_tokens=new)
        plain, _ = _profile_loop(
            "plain", inference_api._generate_jit, {**common, "mesh": None}, make, layout, s
        )
        plain["steps"] = new - 1
        sp, (module, parts, times, out) = _profile_loop(
            "speculative", spec_lib.generate_jit, {**common, "spec": spec}, make, layout, s
        )
        rounds = int(np.asarray(out[5].rounds).max())
        draft_comps, round_comps = hlo_profile.while_regions(module, DRAFT_MARKER)
        regions = {
            "draft": hlo_profile.sum_parts(module, parts, times, draft_comps),
            "verify": hlo_profile.sum_parts(module, parts, times, round_comps - draft_comps),
        }
        regions["outside"] = hlo_profile.sum_parts(
            module, parts, times, set(module.by_computation) - round_comps
        )
        sp.update(steps=rounds, k=k, draft_window=spec.draft_window, regions=regions)
        sp["draft_ms_per_round"] = _total(regions["draft"]) / rounds
        sp["verify_ms_per_round"] = _total(regions["verify"]) / rounds
        sp["draft_step_in_loop_ms"] = sp["draft_ms_per_round"] / k
        standalone = {
            "decode_step": _standalone(cfg, params, make_cache, None, s),
            "draft_step": _standalone(cfg, params, make_cache, spec.draft_window, s),
        }
        for row in (plain, sp):
            row.update(context=context, batch=batch, slots=slots)
            row["ms_per_step"] = row["wall_ms"] / row["steps"]
            copied = row["parts"]["kv_copy"]["ms"] + row["parts"]["kv_block"]["ms"]
            row["kv_copy_share"] = copied / row["thunks_ms"]  # layers and blocks
            results["profile"].append(row)
            print({key: v for key, v in row.items() if key not in ("parts", "regions", "top")})
        results["standalone"].append({"context": context, "batch": batch, **standalone})
        print(results["standalone"][-1], flush=True)


def slices(results: dict, cfg: ModelConfig, params: Any, s: Settings) -> None:
    for slots in s.contexts:
        shape = layer_slices.ReadShape.of(cfg, s.batch, slots)
        for queries in (1, s.k + 1):
            results["slices"].append(layer_slices.ab_row(shape, queries, s.reads, s.repeats))
            print(results["slices"][-1], flush=True)
    for target in s.aot_targets:
        shape = layer_slices.ReadShape.of(cfg, s.batch, s.aot_context)
        results["aot"].append(layer_slices.aot_row(shape, target))
        print(results["aot"][-1], flush=True)


def _table(head: list[str], rows: list[list[Any]]) -> str:
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(map(fmt, r)) + " |" for r in rows])


def markdown(results: dict) -> str:
    """The tables of a run (decode_profile.md)."""
    md = [f"`{results['run']['command']}`\n"]
    if results["profile"]:
        head = ["context", "loop", "steps / rounds", "wall ms", "thunks ms"]
        head += [f"{p.value} ms" for p in Part] + ["K/V copies share"]
        rows = [
            [r["context"], r["loop"], r["steps"], r["wall_ms"], r["thunks_ms"]]
            + [r["parts"][p.value]["ms"] for p in Part]
            + [f"{100 * r['kv_copy_share']:.0f} %"]
            for r in results["profile"]
        ]
        md.append("## profile\n\n" + _table(head, rows) + "\n")
        head = ["context", "region"] + [f"{p.value} ms" for p in Part] + ["total ms"]
        rows = [
            [r["context"], region] + [parts[p.value]["ms"] for p in Part] + [_total(parts)]
            for r in results["profile"]
            if "regions" in r
            for region, parts in r["regions"].items()
        ]
        md.append("### speculative loop by region\n\n" + _table(head, rows) + "\n")
        head = ["context", "draft ms / round", "verify ms / round", "draft step in loop ms"]
        head += ["standalone draft step: wall ms", "its thunks ms"]
        head += ["standalone decode step: wall ms", "its thunks ms"]
        spec = [r for r in results["profile"] if "regions" in r]
        rows = [
            [r["context"], r["draft_ms_per_round"], r["verify_ms_per_round"]]
            + [r["draft_step_in_loop_ms"], s["draft_step"]["wall_ms"], s["draft_step"]["thunks_ms"]]
            + [s["decode_step"]["wall_ms"], s["decode_step"]["thunks_ms"]]
            for r, s in zip(spec, results["standalone"], strict=True)
        ]
        md.append("### draft steps in the loop and alone\n\n" + _table(head, rows) + "\n")
    if results["slices"]:
        keys = list(results["slices"][0])
        rows = [[r[key] for key in keys] for r in results["slices"]]
        md.append("## slices\n\n" + _table(keys, rows) + "\n")
    if results["aot"]:
        keys = list(dict.fromkeys(key for r in results["aot"] for key in r))
        rows = [[r.get(key, "") for key in keys] for r in results["aot"]]
        md.append("### compiled for accelerators\n\n" + _table(keys, rows) + "\n")
    return "\n".join(md)


def load(model: str | None, config: str) -> tuple[ModelConfig, Any]:
    """(cfg, params) of a trained model directory (load_model), or, model None, the Orthros
    arm at config's model shape with random weights (the timings do not depend on them)."""
    if model:
        from orthros_jax.checkpoint import load_model

        loaded = load_model(model)
        return loaded.cfg, jax.device_put(loaded.params)
    cfg = bench.model_configs(load_config_file(config).model, {bench.ORTHROS: {}})[bench.ORTHROS]
    return cfg, jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))


SUITES = {"profile": profile, "slices": slices}


def run(
    out_dir: str, cfg: ModelConfig, params: Any, model: str, suites: list[str], s: Settings
) -> dict:
    """Runs the suites on (cfg, params), writes out_dir/decode_profile.json and .md; returns
    the results. model: what the results name as the model."""
    for name in suites:
        if name not in SUITES:
            raise ValueError(f"--suites: unknown suite {name!r}; allowed: {sorted(SUITES)}")
    t0 = time.perf_counter()
    results: dict = collections.defaultdict(list)
    results.update(model=model, settings=dataclasses.asdict(s), load_before=os.getloadavg())
    for name in suites:
        SUITES[name](results, cfg, params, s)
    results["run"] = run_record(t0)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "decode_profile.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = markdown(results)
    with open(os.path.join(out_dir, "decode_profile.md"), "w") as f:
        f.write(md)
    print(md)
    return results


def main(argv: list[str]) -> None:
    del argv
    s = Settings(
        contexts=tuple(map(int, FLAGS.contexts)),
        batch=FLAGS.batch,
        k=FLAGS.k,
        new=FLAGS.new,
        repeats=FLAGS.repeats,
        reads=FLAGS.reads,
        aot_targets=tuple(FLAGS.aot_targets),
        aot_context=FLAGS.aot_context,
    )
    cfg, params = load(FLAGS.model, FLAGS.config)
    run(FLAGS.out, cfg, params, FLAGS.model or FLAGS.config, FLAGS.suites, s)


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["out"])
    app.run(main)
