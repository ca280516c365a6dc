"""An evaluation run: tasks on one loaded model -> a metrics dict, metrics.json and heatmaps.

Tasks:
  lm       NLL / bits-per-byte on the held-out split of a corpus (PT batches, as in training)
  passkey  needle-in-a-haystack over context lengths x depths (a heatmap PNG)
  mqar     multi-query associative recall over context lengths (pairs >= gap tokens back)

Everything a run writes goes into one output directory: metrics.json and, per recall task,
niah_<task>.png.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.data import (
    DataConfig,
    RecallExample,
    RecallTask,
    load_tokenizer,
    make_eval_batches,
)
from orthros_jax.data.tokenizers import Tokenizer
from orthros_jax.evaluation import metrics
from orthros_jax.model import Params

TASKS: tuple[str, ...] = ("lm", "passkey", "mqar")
METRICS_JSON = "metrics.json"


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """What to evaluate. Lengths are in tokens.

    lm_*: the held-out PT batches (corpus, split fraction and seq_len as in training, so the
      split is the one the model never saw). context_lengths: recall grid lengths; empty =
      2, 4, 8 and 16 x the model's window, those the task fits in. mqar_gap: minimum tokens
      between the last pair and the first query; 0 = 2 x window (beyond the window).
      passkey_digits: digits of the passkey (as the model was trained: DataConfig's
      recall_passkey_digits).
    """

    tasks: tuple[str, ...] = ("lm", "passkey")
    decode: str = "teacher_forced"
    batch_size: int = 16
    lm_corpus: tuple[str, ...] = ("embedded",)
    lm_seq_len: int = 256
    lm_batches: int = 8
    lm_validation_fraction: float = 0.05
    context_lengths: tuple[int, ...] = ()
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    samples: int = 4
    seed: int = 0
    mqar_pairs: int = 8
    mqar_queries: int = 4
    mqar_gap: int = 0
    passkey_digits: int = 5
    filler: str = "fixed"

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise ValueError(f"EvalSpec.tasks={self.tasks!r}: allowed {', '.join(TASKS)}")
        if self.decode not in metrics.DECODES:
            raise ValueError(
                f"EvalSpec.decode={self.decode!r}: allowed {', '.join(metrics.DECODES)}"
            )
        for name in ("batch_size", "lm_seq_len", "lm_batches", "samples", "passkey_digits"):
            if getattr(self, name) < 1:
                raise ValueError(f"EvalSpec.{name} must be >= 1, got {getattr(self, name)}")
        if any(not 0.0 <= d <= 1.0 for d in self.depths) or not self.depths:
            raise ValueError(f"EvalSpec.depths must be non-empty, in [0, 1]: {self.depths}")
        if any(n < 1 for n in self.context_lengths):
            raise ValueError(f"EvalSpec.context_lengths must be positive: {self.context_lengths}")

    def replace(self, **changes: Any) -> EvalSpec:
        return dataclasses.replace(self, **changes)


def recall_task(
    spec: EvalSpec, task: str, cfg: ModelConfig, tokenizer: Tokenizer
) -> tuple[RecallTask, tuple[int, ...]]:
    """The generator for `task` and the context lengths to evaluate it at."""
    gap = spec.mqar_gap or 2 * cfg.window
    lengths = spec.context_lengths or tuple(k * cfg.window for k in (2, 4, 8, 16))
    smallest = min(lengths)
    gen = RecallTask(
        tokenizer,
        task,
        context_len=10**9,  # placeholder: every example below passes its own length
        n_pairs=spec.mqar_pairs,
        n_queries=spec.mqar_queries,
        gap=gap,
        filler=spec.filler,
        passkey_digits=spec.passkey_digits,
    )
    need = gen.min_context()
    if spec.context_lengths and smallest < need:
        raise ValueError(
            f"context length {smallest} is too short for {task} (needs >= {need} tokens"
            + (f" with mqar_pairs={spec.mqar_pairs}, gap={gap}" if task == "mqar" else "")
            + ")"
        )
    fitting = tuple(n for n in lengths if n >= need) or (-(-need // 64) * 64,)
    return gen, fitting


def recall_examples(
    spec: EvalSpec, task: str, cfg: ModelConfig, tokenizer: Tokenizer
) -> tuple[list[RecallExample], tuple[int, ...], tuple[float, ...]]:
    """(examples, lengths, depths) of the evaluation grid; depths is (0.0,) for mqar."""
    gen, lengths = recall_task(spec, task, cfg, tokenizer)
    depths = spec.depths if task == "passkey" else (0.0,)
    return gen.grid(lengths, depths, spec.samples, spec.seed), lengths, depths


def _recall(
    spec: EvalSpec, task: str, cfg: ModelConfig, params: Params, tokenizer: Tokenizer
) -> dict[str, Any]:
    examples, lengths, depths = recall_examples(spec, task, cfg, tokenizer)
    records = metrics.recall_records(
        cfg, params, examples, decode=spec.decode, batch_size=spec.batch_size
    )
    by_length = {}
    for n in lengths:
        cell = [r for r in records if r["context_len"] == n]
        by_length[str(n)] = metrics.summarize_records(cell)["accuracy"]
    # mqar records carry the pairs' mean relative position as depth, so its grid is by length
    grid_records = records if task == "passkey" else [r | {"depth": 0.0} for r in records]
    grid = metrics.grid_matrix(grid_records, lengths, depths)
    return {
        **metrics.summarize_records(records),
        "decode": spec.decode,
        "context_lengths": list(lengths),
        "depths": list(depths),
        "accuracy_by_length": by_length,
        "grid": [[None if np.isnan(v) else float(v) for v in row] for row in grid],
        "min_distance": min(r["distance"] for r in records),
        "window": cfg.window,
    }


def evaluate(
    cfg: ModelConfig, params: Params, spec: EvalSpec, tokenizer_file: str | None = None
) -> dict[str, Any]:
    """Runs spec.tasks on a model; returns {task: metrics} plus "model" and "seconds"."""
    tokenizer = load_tokenizer(tokenizer_file)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is "
            f"{cfg.vocab_size}: pass the model's own tokenizer"
        )
    t0 = time.perf_counter()
    out: dict[str, Any] = {"model": cfg.to_dict(), "spec": dataclasses.asdict(spec)}
    for task in spec.tasks:
        if task == "lm":
            data = DataConfig(
                kind="pt",
                corpus=spec.lm_corpus,
                tokenizer=tokenizer_file,
                seq_len=spec.lm_seq_len,
                batch_size=spec.batch_size,
                validation_fraction=spec.lm_validation_fraction,
            )
            batches = make_eval_batches(data, spec.lm_batches, process_index=0, process_count=1)
            out["lm"] = metrics.lm_metrics(cfg, params, batches, tokenizer)
        else:
            out[task] = _recall(spec, task, cfg, params, tokenizer)
    out["seconds"] = time.perf_counter() - t0
    return out


def write_results(
    results: Mapping[str, Any], out_dir: str, *, title: str = "", heatmaps: bool = True
) -> list[str]:
    """Writes out_dir/metrics.json and niah_<task>.png per recall task; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, METRICS_JSON)
    with open(path, "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
    written = [path]
    for task in ("passkey", "mqar"):
        if heatmaps and task in results:
            r = results[task]
            png = os.path.join(out_dir, f"niah_{task}.png")
            grid = np.array([[np.nan if v is None else v for v in row] for row in r["grid"]])
            label = f"{title} {task}".strip()
            metrics.plot_heatmap(
                grid, r["context_lengths"], r["depths"], png, title=label, window=r["window"]
            )
            written.append(png)
    return written


def evaluate_model_dir(model_dir: str, out_dir: str, spec: EvalSpec) -> dict[str, Any]:
    """Loads a model directory or training workdir (checkpoint.load_model), evaluates it and
    writes the results into out_dir (nothing else is written)."""
    from orthros_jax.checkpoint import load_model

    loaded = load_model(model_dir)
    results = evaluate(loaded.cfg, loaded.params, spec, loaded.tokenizer_file)
    results["model_dir"] = os.path.abspath(model_dir)
    write_results(results, out_dir, title=loaded.cfg.architecture)
    return results
