"""Reward rising under GRPO: a tiny model SFT-warmed on the passkey task, then GRPO, per arm
and seed; the mean greedy reward on held-out prompts before and after.

    python benchmarks/rl_reward.py --arms=orthros,transformer --seeds=0,1 \
        --warm_steps=150 --rl_steps=40 --out=runs/rl_reward

Per arm: one SFT warm-up (configs/recall_passkey.py:<arm>, --warm_steps updates), the same for
every seed; per seed: launch/rl.py --config=configs/rl_passkey.py:<warm workdir> with
train.seed=<seed> (prompts, sampling) for --rl_steps steps. Both arms get the same recipe,
data and budget. Reads each run's metrics.jsonl (eval/reward at step 0 and at the end) and
writes results.json and results.md under --out.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.run_record import run_record  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_list("arms", ["orthros", "transformer"], "configs/recall_passkey.py arms.")
    flags.DEFINE_list("seeds", ["0", "1"], "RL seeds (train.seed of launch/rl.py).")
    flags.DEFINE_integer("warm_steps", 150, "SFT warm-up updates on passkey.")
    flags.DEFINE_integer("rl_steps", 40, "GRPO steps.")
    flags.DEFINE_string("out", "runs/rl_reward", "Output directory (workdirs inside).")
    flags.DEFINE_float("rl_lr", 1e-4, "GRPO learning rate (optimizer.lr of launch/rl.py).")


def _run(args: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(
        [sys.executable, *args, "--config.train.progress_bar=False"], cwd=ROOT, env=env, check=True
    )


def _rewards(workdir: str) -> dict[int, float]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["reward"] for r in rows if r["split"] == "eval"}


def main(argv: list[str]) -> None:
    del argv
    t0 = time.perf_counter()
    out = os.path.abspath(FLAGS.out)
    results: dict = {
        "warm_steps": FLAGS.warm_steps,
        "rl_steps": FLAGS.rl_steps,
        "rl_lr": FLAGS.rl_lr,
    }
    results["arms"] = {}
    for arm in FLAGS.arms:
        warm = os.path.join(out, f"warm_{arm}")
        _run(
            [
                "launch/train.py",
                f"--config=configs/recall_passkey.py:{arm}",
                f"--config.train.steps={FLAGS.warm_steps}",
                f"--workdir={warm}",
            ]
        )
        runs = {}
        for seed in FLAGS.seeds:
            wd = os.path.join(out, f"rl_{arm}_s{seed}")
            _run(
                [
                    "launch/rl.py",
                    f"--config=configs/rl_passkey.py:{warm}",
                    f"--config.train.steps={FLAGS.rl_steps}",
                    f"--config.train.seed={seed}",
                    f"--config.optimizer.lr={FLAGS.rl_lr}",
                    f"--workdir={wd}",
                ]
            )
            r = _rewards(wd)
            runs[seed] = {"before": r[0], "after": r[max(r)], "curve": r}
        results["arms"][arm] = runs
    lines = ["| arm | seed | reward before | reward after |", "|---|---|---|---|"]
    for arm, runs in results["arms"].items():
        for seed, r in runs.items():
            lines.append(f"| {arm} | {seed} | {r['before']:.3f} | {r['after']:.3f} |")
        before = [r["before"] for r in runs.values()]
        after = [r["after"] for r in runs.values()]
        sd = lambda x: statistics.stdev(x) if len(x) > 1 else 0.0
        lines.append(
            f"| {arm} | mean ± sd | {statistics.mean(before):.3f} ± {sd(before):.3f} | "
            f"{statistics.mean(after):.3f} ± {sd(after):.3f} |"
        )
    results["load"] = os.getloadavg()
    results |= run_record(t0)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    define_flags()
    app.run(main)
