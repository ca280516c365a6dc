"""Experiment results -> markdown tables and one figure (launch/experiments.py writes both).

The results dict (results.json) has one entry per experiment that ran:
  recall   {"arms": {arm: {accuracy_mean, accuracy_std, runs: [...]}}, "setup", "seconds"}
  lm       {"arms": {arm: {nll_mean, nll_std, bpb_mean, runs}}, "setup", "seconds"}; a MoE
           arm's runs also carry expert_load() and the arm its aggregate_load()
  convert  {"arms": {stage: {nll_mean, nll_std, before, runs, curves}}, "pretrain", "setup", ...}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from orthros_jax.config.architectures import TWO_STREAM_FORM
from orthros_jax.evaluation.arms import ARMS
from orthros_jax.evaluation.arms import label as arm_label

EXPERIMENTS = ("recall", "lm", "convert")
# Each arm's matplotlib colour (evaluation/arms.py: labels, colours and order live there).
COLORS = {name: arm.colour for name, arm in ARMS.items()}


def aggregate(runs: Sequence[Mapping[str, Any]], key: str) -> dict[str, float]:
    """{key_mean, key_std, n} over runs; std is the sample std (ddof=1), 0 for one run."""
    values = np.array([float(r[key]) for r in runs])
    std = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return {f"{key}_mean": float(values.mean()), f"{key}_std": std, "n": len(values)}


def eval_curve(workdir: str) -> list[tuple[int, float]]:
    """(step, held-out loss) pairs the training loop logged to workdir/metrics.jsonl."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(int(r["step"]), float(r["loss"])) for r in rows if r.get("split") == "eval"]


# The train metrics' per-expert load share keys (training/metrics.moe_log_values): <prefix><e>.
LOAD_PREFIX = "moe_load/"
# The load-balance figures of a MoE run, aggregated over seeds by aggregate_load.
LOAD_KEYS = ("load_max_over_min", "load_cv", "balance_loss")


def expert_load(workdir: str) -> dict[str, Any]:
    """The experts' load balance at the end of training, from the last train row of
    workdir/metrics.jsonl: load [E] (each expert's share of the routed (token, choice) pairs
    over that row's log interval, summed over the MoE layers and both streams),
    load_max_over_min (inf when an expert got nothing), load_cv (std / mean of the shares; 0 is
    perfect balance) and balance_loss (transformers' aux loss over the same interval: top_k when
    the loads and mean router probabilities are even). {} for a
    run without MoE layers."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r.get("split") != "eval" and f"{LOAD_PREFIX}0" in r]
    if not rows:
        return {}
    last = rows[-1]
    n = sum(1 for k in last if k.startswith(LOAD_PREFIX))
    load = np.array([float(last[f"{LOAD_PREFIX}{e}"]) for e in range(n)])
    low = float(load.min())
    return {
        "load": load.tolist(),
        "load_step": int(last["step"]),
        "load_max_over_min": float(load.max()) / low if low > 0 else math.inf,
        "load_cv": float(load.std() / load.mean()),
        "balance_loss": float(last["moe_balance_loss"]),
    }


def aggregate_load(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """{<key>_mean, <key>_std} over runs for each of LOAD_KEYS ({} unless every run has an
    expert_load)."""
    if not runs or not all("load_cv" in r for r in runs):
        return {}
    out: dict[str, float] = {}
    for key in LOAD_KEYS:
        agg = aggregate(runs, key)
        out |= {f"{key}_mean": agg[f"{key}_mean"], f"{key}_std": agg[f"{key}_std"]}
    return out


def load_cells(arm: Mapping[str, Any]) -> str:
    """An arm's load-balance table cells (max/min, CV, balance loss), dashes without MoE."""
    if "load_cv_mean" not in arm:
        return "— | — | —"
    return " | ".join(
        _pm(arm[f"{key}_mean"], arm[f"{key}_std"], 2 if key == "load_max_over_min" else 3)
        for key in LOAD_KEYS
    )


LOAD_HEADER = "expert load max/min | load CV | balance loss"


def _pm(mean: float, std: float, digits: int = 3) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def label(arm: str) -> str:
    return arm_label(arm)


def stage_label(stage: str) -> str:
    """A conversion experiment's stage: the base model's continued pretraining or a converted
    arm."""
    base = stage in TWO_STREAM_FORM  # a single-stream architecture: the conversion's source
    return f"{label(stage)} (base CPT)" if base else f"{label(stage)} (converted)"


def arms_in_order(arms: Mapping[str, Any]) -> list[str]:
    """Arm names in the canonical order (results.json is written with sorted keys)."""
    order = list(ARMS)
    return sorted(arms, key=lambda a: order.index(a) if a in order else len(order))


def markdown(results: Mapping[str, Any]) -> str:
    """The README-ready tables of whichever experiments are in results."""
    lines: list[str] = []
    if "recall" in results:
        r = results["recall"]
        s = r["setup"]
        lengths = s["eval"]["context_lengths"]
        lines += [
            f"**1. Recall beyond the window** ({s.get('digits', 5)}-digit passkey; "
            f"trained at context {s['train_context']} = "
            f"{s['train_context'] // s['window']} x window {s['window']}, {s['steps']} steps, "
            f"{s['seeds']} seed(s); query accuracy, teacher-forced argmax, "
            f"{s['eval']['samples']} samples x {len(s['eval']['depths'])} depths per length)",
            "",
            "| arm | accuracy (all lengths) | " + " | ".join(f"T={n}" for n in lengths) + " |",
            "|---|---|" + "---|" * len(lengths),
        ]
        for arm in arms_in_order(r["arms"]):
            a = r["arms"][arm]
            per_len = [
                np.mean([run["accuracy_by_length"][str(n)] for run in a["runs"]]) for n in lengths
            ]
            lines.append(
                f"| {label(arm)} | {_pm(a['accuracy_mean'], a['accuracy_std'], 2)} | "
                + " | ".join(f"{v:.2f}" for v in per_len)
                + " |"
            )
        lines += [""]
    if "lm" in results:
        r = results["lm"]
        s = r["setup"]
        lines += [
            f"**2. Byte-level LM** (embedded corpus, {s['steps']} steps, T={s['seq_len']}, "
            f"batch {s['batch_size']}, window {s['window']}, {s['model']}; held-out NLL in "
            f"nats/byte, mean ± std over {s['seeds']} seeds)",
            "",
        ]
        moe = any("load_cv_mean" in a for a in r["arms"].values())  # the load columns
        lines += [
            "| arm | NLL | bits/byte | per seed |" + (f" {LOAD_HEADER} |" if moe else ""),
            "|---|---|---|---|" + ("---|---|---|" if moe else ""),
        ]
        for arm in arms_in_order(r["arms"]):
            a = r["arms"][arm]
            seeds = ", ".join(f"{run['nll']:.3f}" for run in a["runs"])
            lines.append(
                f"| {label(arm)} | {_pm(a['nll_mean'], a['nll_std'])} "
                f"| {a['bpb_mean']:.3f} | {seeds} |" + (f" {load_cells(a)} |" if moe else "")
            )
        if moe:
            lines += [
                "",
                "Expert load: each expert's share of the routed (token, choice) pairs over the "
                "last training log interval (all MoE layers, both streams), mean ± std over "
                "seeds; CV = std / mean of the shares (0: even); balance loss: transformers' "
                "aux loss, top_k when loads and router probabilities are even.",
            ]
        lines += [""]
    if "convert" in results:
        r = results["convert"]
        s = r["setup"]
        lines += [
            f"**3. Conversion** (Transformer pretrained {s['pretrain_steps']} steps at T="
            f"{s['seq_len']}: held-out NLL {r['pretrain']['nll']:.3f}; then {s['continue_steps']} "
            f"more steps per arm, {s['seeds']} seeds; Orthros window {s['window']})",
            "",
            "| arm | NLL right after conversion | NLL after continued training | per seed |",
            "|---|---|---|---|",
        ]
        for stage in arms_in_order(r["arms"]):
            a = r["arms"][stage]
            name = stage_label(stage)
            seeds = ", ".join(f"{run['nll']:.3f}" for run in a["runs"])
            lines.append(
                f"| {name} | {a['before']['nll']:.3f} "
                f"| {_pm(a['nll_mean'], a['nll_std'])} | {seeds} |"
            )
        lines += [""]
    times = [
        f"{e} {results[e]['seconds'] / 60:.1f} min"
        for e in EXPERIMENTS
        if "seconds" in results.get(e, {})
    ]
    if times:
        lines.append(f"Run time: {', '.join(times)} ({results.get('devices', '')}).")
    return "\n".join(lines) + "\n"


def plot(results: Mapping[str, Any], path: str) -> None:
    """One PNG with a panel per experiment that ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [e for e in ("recall", "lm", "convert") if e in results]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, exp in zip(axes[0], panels, strict=True):
        r = results[exp]
        if exp == "recall":
            lengths = r["setup"]["eval"]["context_lengths"]
            arms = arms_in_order(r["arms"])
            width = 0.8 / max(len(arms), 1)
            for i, arm in enumerate(arms):
                runs = r["arms"][arm]["runs"]
                acc = [[run["accuracy_by_length"][str(n)] for run in runs] for n in lengths]
                x = np.arange(len(lengths)) + (i - (len(arms) - 1) / 2) * width
                means = [np.mean(a) for a in acc]
                for xi, m in zip(x, means, strict=True):
                    if m == 0:  # a zero-height bar is invisible: say so
                        ax.text(xi, 0.01, "0", ha="center", va="bottom", fontsize=8)
                ax.bar(
                    x,
                    means,
                    width,
                    yerr=[np.std(a) for a in acc],
                    label=label(arm),
                    color=COLORS.get(arm),
                )
            ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
            ax.set_xlabel(f"context length (window {r['setup']['window']})")
            ax.set_ylabel("passkey accuracy")
            ax.set_ylim(0, 1.05)
            ax.set_title("1. recall beyond the window")
            ax.legend(fontsize=8)
        elif exp == "lm":
            arms = arms_in_order(r["arms"])
            means = [r["arms"][a]["nll_mean"] for a in arms]
            stds = [r["arms"][a]["nll_std"] for a in arms]
            ax.bar(
                range(len(arms)), means, yerr=stds, color=[COLORS.get(a) for a in arms], capsize=4
            )
            for i, a in enumerate(arms):
                xs = [i] * len(r["arms"][a]["runs"])
                ax.scatter(
                    xs, [run["nll"] for run in r["arms"][a]["runs"]], color="k", s=8, zorder=3
                )
            ax.set_xticks(range(len(arms)), [label(a) for a in arms], rotation=15)
            lo = min(m - s for m, s in zip(means, stds, strict=True))
            hi = max(m + s for m, s in zip(means, stds, strict=True))
            pad = max(0.05, 0.5 * (hi - lo))
            ax.set_ylim(max(0.0, lo - pad), hi + pad)
            ax.set_ylabel("held-out NLL (nats/byte)")
            ax.set_title("2. byte-level LM, equal steps")
        else:
            for stage in arms_in_order(r["arms"]):
                a = r["arms"][stage]
                curves = [c for c in a["curves"] if c]
                name = stage_label(stage)
                if curves:
                    steps = [s for s, _ in curves[0]]
                    loss = np.array([[v for _, v in c] for c in curves if len(c) == len(steps)])
                    steps = [0, *steps]
                    mean = [a["before"]["nll"], *loss.mean(0)]
                    ax.plot(steps, mean, marker="o", label=name, color=COLORS.get(stage))
            ax.axhline(r["pretrain"]["nll"], color="k", ls=":", lw=1, label="after pretraining")
            ax.set_xlabel("continued-training step")
            ax.set_ylabel("held-out NLL (nats/byte)")
            ax.set_title("3. conversion vs base CPT")
            ax.legend(fontsize=8)
            if not math.isfinite(r["pretrain"]["nll"]):
                ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_recall_heatmaps(results: Mapping[str, Any], path: str) -> bool:
    """One NIAH heatmap per arm (accuracy averaged over seeds) side by side; False if no
    recall results."""
    if "recall" not in results:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = results["recall"]
    lengths, depths = r["setup"]["eval"]["context_lengths"], r["setup"]["eval"]["depths"]
    arms = arms_in_order(r["arms"])
    fig, axes = plt.subplots(
        1, len(arms), figsize=(0.9 + 2.6 * len(arms), 1.3 + 0.45 * len(depths)), squeeze=False
    )
    for ax, arm in zip(axes[0], arms, strict=True):
        grids = [np.array(run["grid"], dtype=float) for run in r["arms"][arm]["runs"]]
        acc = np.mean(grids, axis=0)  # [lengths, depths]
        im = ax.imshow(acc.T, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        for i in range(len(lengths)):
            for j in range(len(depths)):
                ax.text(i, j, f"{acc[i, j]:.2f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_xlabel("context length")
        ax.set_title(label(arm), fontsize=10)
        if ax is not axes[0][0]:
            ax.tick_params(labelleft=False)
    axes[0][0].set_ylabel("needle depth")
    fig.colorbar(im, ax=axes[0].tolist(), label="accuracy", shrink=0.9)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True
