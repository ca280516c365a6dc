"""The cheap-conversion study (issue 36 item 4): experiment 3's Transformer -> Orthros
conversion (byte-level, T = 128, window 16) continued with only the scale-offsets, with SO +
LoRA r 8 / r 32, or with every parameter (configs/convert_cheap.py's arms), at equal steps.

    python benchmarks/cheap_conversion.py --arms=so,lora8,lora32,full --seeds=0,1,2 \
        --pretrain_steps=200 --steps=100 --out=runs/cheap_conversion

One pretrained Transformer (configs/lm_convert.py:pretrain, --pretrain_steps), converted once
with identity scale-offsets; per arm and seed, --steps continuation updates (train.seed and
data.seed = 100 + seed, as launch/experiments.py's conversion), then the held-out nats/byte
(16 x 16 rows of 128 bytes; a LoRA model evaluated merged). Per arm also its trainable
parameters and AdamW state (shapes only). Writes results.json and results.md under --out.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

import jax
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.config.cli import load_config_file  # noqa: E402
from orthros_jax.convert import from_transformer  # noqa: E402
from orthros_jax.evaluation import EvalSpec, evaluate  # noqa: E402
from orthros_jax.training import TrainConfig, init_train_state, make_optimizer, train  # noqa: E402
from orthros_jax.training.trainable import trainable_subset  # noqa: E402

LM_EVAL = EvalSpec(tasks=("lm",), lm_seq_len=128, lm_batches=16, batch_size=16)
QUIET = {"train.progress_bar": False, "train.checkpoint_every": 0, "train.eval_every": 0}


def define_flags() -> None:
    flags.DEFINE_list("arms", ["so", "lora8", "lora32", "full"], "configs/convert_cheap.py arms.")
    flags.DEFINE_list("seeds", ["0", "1", "2"], "Continuation seeds.")
    flags.DEFINE_integer("pretrain_steps", 200, "Transformer pretraining updates.")
    flags.DEFINE_integer("steps", 100, "Continuation updates per arm and seed.")
    flags.DEFINE_string("out", "runs/cheap_conversion", "Output directory (workdirs inside).")


def config(spec: str, **overrides) -> TrainConfig:
    c = load_config_file(os.path.join(ROOT, "configs", spec))
    c.update_from_flattened_dict(overrides)
    return TrainConfig.from_config(c)


def nll(model_dir: str) -> float:
    loaded = checkpoint.load_model(model_dir)  # merged
    return float(evaluate(loaded.cfg, loaded.params, LM_EVAL, None)["lm"]["nll"])


def footprint(cfg: TrainConfig) -> tuple[int, int]:
    """(trainable parameters, AdamW state bytes) of the run, from shapes."""
    subset = trainable_subset(cfg.model, cfg.train.trainable)
    tx = make_optimizer(cfg.optimizer, cfg.train.steps, cfg.model)
    init = lambda r: init_train_state(cfg.model, tx, r, None, subset)
    state = jax.eval_shape(init, jax.random.PRNGKey(0))
    trained, _ = subset.split(state.params)
    n = sum(math.prod(a.shape) for a in jax.tree.leaves(trained))
    return n, sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(state.opt_state))


def main(argv: list[str]) -> None:
    del argv
    f = flags.FLAGS
    out = os.path.abspath(f.out)
    t0 = time.perf_counter()
    pre = os.path.join(out, "pretrain")
    if not os.path.isdir(os.path.join(pre, checkpoint.CHECKPOINTS_DIR)):
        train(config("lm_convert.py:pretrain", **QUIET, **{"train.steps": f.pretrain_steps}), pre)
    loaded = checkpoint.load_model(pre)
    window = config("convert_cheap.py:full").model.window
    cfg, params = from_transformer(loaded.params, loaded.cfg, window=window, scale_offset=True)
    converted = os.path.join(out, "converted")
    checkpoint.save_model(converted, cfg, params, loaded.tokenizer_file)
    results = {"pretrain_nll": nll(pre), "converted_nll": nll(converted), "arms": {}}
    for arm in f.arms:
        runs = []
        for seed in map(int, f.seeds):
            extra = {"train.seed": seed, "data.seed": 100 + seed, "train.steps": f.steps}
            run = config(f"convert_cheap.py:{arm}", **QUIET, **extra, init_from=converted)
            workdir = os.path.join(out, f"{arm}_s{seed}")
            train(run, workdir)
            runs.append(nll(workdir))
        n, opt = footprint(run)
        mean = statistics.mean(runs)
        std = statistics.stdev(runs) if len(runs) > 1 else 0.0
        results["arms"][arm] = dict(nll=mean, std=std, runs=runs, trainable=n, opt_bytes=opt)
        print(f"{arm}: {mean:.3f} ± {std:.3f} {runs}", flush=True)
    results["setup"] = dict(
        pretrain_steps=f.pretrain_steps, steps=f.steps, seeds=f.seeds, window=window
    )
    results["seconds"] = time.perf_counter() - t0
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    rows = [
        "| arm | held-out nats/byte | per seed | trainable params | AdamW state |",
        "|---|---|---|---:|---:|",
    ]
    for arm, r in results["arms"].items():
        seeds = ", ".join(f"{x:.3f}" for x in r["runs"])
        rows.append(
            f"| {arm} | {r['nll']:.3f} ± {r['std']:.3f} | {seeds} | {r['trainable']:,} | "
            f"{r['opt_bytes'] / 2**10:.1f} KiB |"
        )
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    define_flags()
    app.run(main)
