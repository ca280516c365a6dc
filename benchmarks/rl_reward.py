"""Reward rising under GRPO: a tiny model SFT-warmed on the passkey task, then GRPO, per arm
and seed; the reward on held-out prompts before and after.

    python benchmarks/rl_reward.py --arms=orthros,transformer --seeds=0,1 \
        --warm_steps=300 --rl_steps=80 --eval_prompts=256 --out=runs/rl_reward

Per arm: one SFT warm-up (configs/recall_passkey.py:<arm>, --warm_steps updates), the same for
every seed (a warm workdir that already holds its last checkpoint is reused: train.py resumes
it with nothing left to do); per seed: launch/rl.py --config=configs/rl_passkey.py:<warm
workdir> with train.seed=<seed> (prompts, sampling) for --rl_steps steps, --rl_lr and the
--rl_overrides (config overrides, e.g. rollout.prompts=16,rollout.group_size=4). Both arms get
the same recipe, data and budget. Two rewards on the --eval_prompts held-out prompts of the seed:
  greedy    eval/reward of the run's metrics.jsonl (step 0 and the end): the share of prompts
            whose greedy completion is right (steps of 1 / eval_prompts);
  expected  the mean probability of the answer's tokens under softmax(logits / temperature),
            teacher-forced: the expected reward of the policy GRPO samples from, exactly (the
            passkey reward is 1 iff the completion starts with the answer, and with bytes one
            token sequence spells it), without the sampling or argmax noise.
Writes results.json and results.md under --out.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import jax
import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.common import ORTHROS, TRANSFORMER  # noqa: E402
from benchmarks.run_record import run_record  # noqa: E402
from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.config.cli import load_config_file  # noqa: E402
from orthros_jax.data.tokenizers import load_tokenizer  # noqa: E402
from orthros_jax.model import OrthrosLM  # noqa: E402
from orthros_jax.rl import RLConfig, tasks  # noqa: E402
from orthros_jax.rl import batch as batch_lib  # noqa: E402
from orthros_jax.rl.loss import target_logprobs  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_list("arms", [ORTHROS, TRANSFORMER], "configs/recall_passkey.py arms.")
    flags.DEFINE_list("seeds", ["0", "1"], "RL seeds (train.seed of launch/rl.py).")
    flags.DEFINE_integer("warm_steps", 150, "SFT warm-up updates on passkey.")
    flags.DEFINE_integer("rl_steps", 40, "GRPO steps.")
    flags.DEFINE_string("out", "runs/rl_reward", "Output directory (workdirs inside).")
    flags.DEFINE_float("rl_lr", 1e-4, "GRPO learning rate (optimizer.lr of launch/rl.py).")
    flags.DEFINE_integer("eval_prompts", 256, "Held-out prompts of the evaluation (task.).")
    flags.DEFINE_list("rl_overrides", [], "Extra launch/rl.py config overrides, key=value.")


def _run(args: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(
        [sys.executable, *args, "--config.train.progress_bar=False"], cwd=ROOT, env=env, check=True
    )


def _rewards(workdir: str) -> dict[int, float]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["reward"] for r in rows if r["split"] == "eval"}


def expected_reward(model_dir: str, warm: str, seed: int, n: int) -> float:
    """Mean over the seed's first n held-out prompts of P(answer tokens | prompt) under the
    rollout temperature (teacher-forced, one forward over the packed prompt + answer pairs):
    the expected passkey reward of the policy in model_dir (a workdir or model directory)."""
    cfg = RLConfig.from_config(
        load_config_file(os.path.join(ROOT, f"configs/rl_passkey.py:{warm}"))
    )
    if cfg.task.name != "passkey":
        raise ValueError(f"task.name={cfg.task.name!r}: the expected reward is the passkey's")
    loaded = checkpoint.load_model(model_dir)
    tok = load_tokenizer(cfg.task.tokenizer)
    task = tasks.make_task(cfg.task, tok)
    prompts = [task.prompt(seed, tasks.EVAL_STREAM, i) for i in range(n)]
    pairs = [
        batch_lib.Pair(p.ids, np.asarray(tok.encode(p.answer), np.int32), np.zeros(2), 0.0)
        for p in prompts
    ]
    per_row = max(1, cfg.grpo.seq_len // len(pairs[0].prompt) - 1)
    b = batch_lib.pack_pairs(pairs, -(-n // per_row), cfg.grpo.seq_len, cfg.grpo.out_len)
    model, temp = OrthrosLM(loaded.cfg), cfg.rollout.temperature
    lp_RO = jax.jit(lambda p, b: target_logprobs(model, p, b, temp))(loaded.params, b)
    lp = np.asarray(lp_RO) * b["loss_mask"]
    total = np.bincount(b["sequence"].reshape(-1), lp.reshape(-1), minlength=n + 1)[:n]
    return float(np.exp(total).mean())


def _table(results: dict) -> list[str]:
    sd = lambda x: statistics.stdev(x) if len(x) > 1 else 0.0
    ms = lambda x: f"{statistics.mean(x):.3f} ± {sd(x):.3f}"
    lines = [
        "| arm | seed | greedy before | greedy after | expected before | expected after |",
        "|---|---|---|---|---|---|",
    ]
    for arm, runs in results["arms"].items():
        for seed, r in runs.items():
            lines.append(
                f"| {arm} | {seed} | {r['before']:.3f} | {r['after']:.3f} | "
                f"{r['expected_before']:.3f} | {r['expected_after']:.3f} |"
            )
        col = lambda k: [r[k] for r in runs.values()]
        gains = [r["expected_after"] - r["expected_before"] for r in runs.values()]
        lines.append(
            f"| {arm} | mean ± sd | {ms(col('before'))} | {ms(col('after'))} | "
            f"{ms(col('expected_before'))} | {ms(col('expected_after'))} (gain {ms(gains)}) |"
        )
    return lines


def main(argv: list[str]) -> None:
    del argv
    t0 = time.perf_counter()
    out = os.path.abspath(FLAGS.out)
    results: dict = {
        "warm_steps": FLAGS.warm_steps,
        "rl_steps": FLAGS.rl_steps,
        "rl_lr": FLAGS.rl_lr,
        "eval_prompts": FLAGS.eval_prompts,
        "rl_overrides": FLAGS.rl_overrides,
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
                    f"--config.task.eval_prompts={FLAGS.eval_prompts}",
                    *(f"--config.{kv}" for kv in FLAGS.rl_overrides),
                    f"--workdir={wd}",
                ]
            )
            r = _rewards(wd)
            n = FLAGS.eval_prompts
            runs[seed] = {
                "before": r[0],
                "after": r[max(r)],
                "expected_before": expected_reward(warm, warm, int(seed), n),
                "expected_after": expected_reward(wd, warm, int(seed), n),
                "curve": r,
            }
        results["arms"][arm] = runs
    lines = _table(results)
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
