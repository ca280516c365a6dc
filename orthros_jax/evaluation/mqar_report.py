"""MQAR scoring and its report: query accuracy per (length, pairs) cell and per distance.

    cells = score(cfg, params, MQAREval(), data)      # one trained arm; data: its MQARConfig
    text = markdown(results); plot(results, "mqar.png")           # launch/mqar.py's outputs

The results dict (mqar.json): {"arms": {arm: {accuracy_mean, accuracy_std, n, runs: [score()
+ train info]}}, "setup": {...}, "seconds"}. Arm names and colours are report.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.data import mqar
from orthros_jax.evaluation import report
from orthros_jax.evaluation.metrics import teacher_forced_predictions
from orthros_jax.model import Params


@dataclasses.dataclass(frozen=True)
class MQAREval:
    """The scoring grid: lengths x pairs cells (those that fit), `examples` per cell (eval
    stream of `seed`), and distance bin edges in tokens for accuracy by distance."""

    lengths: tuple[int, ...] = (32, 64)
    pairs: tuple[int, ...] = (4, 8)
    examples: int = 64
    distance_bins: tuple[int, ...] = (8, 16, 32)
    seed: int = 0
    batch_size: int = 32

    def __post_init__(self) -> None:
        if self.examples < 1 or self.batch_size < 1:
            raise ValueError(f"eval.examples / batch_size must be >= 1, got {self}")
        if list(self.distance_bins) != sorted(set(self.distance_bins)) or not self.distance_bins:
            raise ValueError(f"eval.distance_bins must rise strictly: {self.distance_bins}")
        if not self.cells():
            raise ValueError(f"eval: no (length, pairs) cell fits (4 * pairs <= length): {self}")

    def cells(self) -> list[tuple[int, int]]:
        return [(n, d) for n in self.lengths for d in self.pairs if 4 * d <= n]


def cell_name(length: int, pairs: int) -> str:
    return f"L={length} D={pairs}"


def score(cfg: ModelConfig, params: Params, ev: MQAREval, data: mqar.MQARConfig) -> dict[str, Any]:
    """{"accuracy": over every query, "cells": {cell_name: accuracy}, "by_distance": {bin:
    accuracy}}: teacher-forced argmax at each query key (one token per answer). The examples
    are drawn as the arm was trained on them: data's vocab_size and power_a."""
    cells, all_ex, all_ok = {}, [], []
    for length, pairs in ev.cells():
        exs = mqar.examples(
            length, pairs, ev.examples, data.vocab_size, seed=ev.seed, power_a=data.power_a
        )
        pred = teacher_forced_predictions(cfg, params, exs, batch_size=ev.batch_size)
        ok = mqar.queries_correct(exs, pred)
        cells[cell_name(length, pairs)] = float(ok.mean())
        all_ex += exs
        all_ok.append(ok)
    ok = np.concatenate(all_ok)
    return {
        "accuracy": float(ok.mean()),
        "cells": cells,
        "by_distance": mqar.accuracy_by_distance(all_ex, ok, ev.distance_bins),
    }


def _mean_over_runs(runs: list[Mapping[str, Any]], key: str, name: str) -> float | None:
    values = [r[key][name] for r in runs if r[key].get(name) is not None]
    return float(np.mean(values)) if values else None


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def markdown(results: Mapping[str, Any]) -> str:
    """The README-ready tables: accuracy per cell, and per distance bin, for every arm (and the
    MoE arms' expert load balance)."""
    s, arms = results["setup"], results["arms"]
    names = [cell_name(n, d) for n, d in s["cells"]]
    bins = mqar.distance_bins(s["distance_bins"])
    lines = [
        f"**MQAR** (Zoology-style; vocab {s['vocab_size']}, {s['model']}, window {s['window']}; "
        f"{s['steps']} steps x {s['batch_size']} rows x {s['seq_len']} tokens, lr {s['lr']}, "
        f"{s['seeds']} seed(s); query accuracy, teacher-forced argmax, {s['examples']} examples "
        f"per cell; chance {2 / s['vocab_size']:.3f})",
        "",
        "| arm | all cells | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for arm in report.arms_in_order(arms):
        a = arms[arm]
        per = [_mean_over_runs(a["runs"], "cells", n) for n in names]
        lines.append(
            f"| {report.label(arm)} | {a['accuracy_mean']:.2f} ± {a['accuracy_std']:.2f} | "
            + " | ".join(_fmt(v) for v in per)
            + " |"
        )
    lines += [
        "",
        f"Accuracy by distance (tokens from the pair's value to its query; window {s['window']}):",
        "",
        "| arm | " + " | ".join(bins) + " |",
        "|---|" + "---|" * len(bins),
    ]
    for arm in report.arms_in_order(arms):
        per = [_mean_over_runs(arms[arm]["runs"], "by_distance", b) for b in bins]
        lines.append(f"| {report.label(arm)} | " + " | ".join(_fmt(v) for v in per) + " |")
    moe = [arm for arm in report.arms_in_order(arms) if "load_cv_mean" in arms[arm]]
    if moe:
        lines += [
            "",
            "Expert load at the end of training (each expert's share of the routed (token, "
            "choice) pairs over the last log interval, all MoE layers, both streams; mean ± std "
            "over seeds):",
            "",
            f"| arm | {report.LOAD_HEADER} |",
            "|---|---|---|---|",
        ]
        lines += [f"| {report.label(arm)} | {report.load_cells(arms[arm])} |" for arm in moe]
    load = results.get("load_average")  # absent in hand-made results
    during = (
        f"; load average {load['start'][0]:.1f} at the start, {load['end'][0]:.1f} at the end"
        if load
        else ""
    )
    lines += ["", f"Run time: {results['seconds'] / 60:.1f} min ({results['devices']}{during})."]
    return "\n".join(lines) + "\n"


def plot(results: Mapping[str, Any], path: str) -> None:
    """Two panels: accuracy per (length, pairs) cell, and accuracy by query distance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, arms = results["setup"], results["arms"]
    names = [cell_name(n, d) for n, d in s["cells"]]
    order = report.arms_in_order(arms)
    bins = mqar.distance_bins(s["distance_bins"])
    chance = 2 / s["vocab_size"]  # one of vocab / 2 values
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / max(len(order), 1)
    for i, arm in enumerate(order):
        runs = arms[arm]["runs"]
        x = np.arange(len(names)) + (i - (len(order) - 1) / 2) * width
        color = report.COLORS.get(arm)
        ax1.bar(
            x,
            [_mean_over_runs(runs, "cells", n) for n in names],
            width,
            color=color,
            label=report.label(arm),
        )
        dist = [_mean_over_runs(runs, "by_distance", b) for b in bins]
        # Distinct markers and sizes: arms at the same accuracy stay visible on top of each other.
        ax2.plot(
            range(len(bins)),
            [np.nan if v is None else v for v in dist],
            color=color,
            marker="osv^D*"[i % 6],
            markersize=9 - 1.5 * (i % 4),
            label=report.label(arm),
        )
    for ax in (ax1, ax2):
        ax.axhline(chance, color="k", ls=":", lw=1, label="chance")
    ax1.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax1.set_ylabel("query accuracy")
    ax1.set_ylim(0, 1.05)
    ax1.set_title("MQAR accuracy per (length L, pairs D)")
    ax1.legend(fontsize=8, loc="center right")
    ax2.set_xticks(range(len(bins)), bins)
    ax2.set_xlabel(f"distance pair -> query (tokens; window {s['window']})")
    ax2.set_ylabel("query accuracy")
    ax2.set_ylim(0, 1.05)
    ax2.set_title("accuracy by distance")
    ax2.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
