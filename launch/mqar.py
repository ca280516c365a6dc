"""The MQAR experiment: every arm trained the same way on Zoology-style associative recall.

    python launch/mqar.py --out=runs/mqar                                # transformer, swa, orthros
    python launch/mqar.py --out=runs/mqar --arms=transformer,swa,orthros,gdn --seeds=2
    python launch/mqar.py --out=runs/mqar --override=train.steps=300     # every arm
    python launch/mqar.py --out=/tmp/mq --tiny                           # seconds (the tests)
    python launch/mqar.py --out=runs/mqar --replot                       # redraw from mqar.json

configs/mqar.py:<arm> describes one arm's run (model and arms of configs/lm_byte.py, the MQAR
data, the scoring grid); any arm that config accepts can be named in --arms. Each (arm, seed)
trains on the same batches from the same initial seed and is scored per (length, pairs) cell
and per query distance (orthros_jax.evaluation.mqar_report). Writes into --out: mqar.json,
mqar.md, mqar.png and work/<arm>_s<seed>/ (training workdirs).

The flags are launch/experiments.py's (this module imports it: the same --out, --arms, --seeds,
--tiny, --override, --keep_work, --replot); without --arms / --seeds the defaults are
DEFAULT_ARMS (transformer, swa, orthros) and one seed. Its --experiments / *_seeds / --convert_arms
do not apply.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any

import experiments  # launch/experiments.py: flags, TINY_OVERRIDES and the run helpers
from absl import app, flags, logging

from orthros_jax.config import cli
from orthros_jax.data import mqar
from orthros_jax.evaluation import arms, mqar_report, report
from orthros_jax.training import TrainConfig, train

CONFIG = os.path.join(experiments.CONFIG_DIR, "mqar.py")
DEFAULT_ARMS = arms.arms_for(arms.MQAR, default=True)  # orthros_jax/evaluation/arms.py
FLAGS = flags.FLAGS
# experiments.py defines the flags; listed in this module's --help as its own.
for _name in ("out", "arms", "seeds", "tiny", "override", "keep_work", "replot"):
    flags.declare_key_flag(_name)
# --tiny: one small shape; the rest of the shrinking is experiments.TINY_OVERRIDES.
TINY_MQAR = {
    "data.train_lengths": (64,),
    "data.train_pairs": (4,),
    "eval.lengths": (64,),
    "eval.pairs": (4,),
    "eval.examples": 2,
}
NOT_HERE = ("experiments", "recall_seeds", "convert_seeds", "convert_arms")


def arm_config(arm: str, overrides: dict[str, Any]) -> tuple[TrainConfig, mqar_report.MQAREval]:
    """The training config (data = MQARConfig) and scoring grid of configs/mqar.py:<arm>."""
    c = cli.load_config_file(f"{CONFIG}:{arm}")
    c.update_from_flattened_dict(overrides)
    plain = dict(cli.to_plain(c))
    data = cli.dataclass_from_dict(mqar.MQARConfig, plain.pop("data"), "data")
    ev = cli.dataclass_from_dict(mqar_report.MQAREval, plain.pop("eval"), "eval")
    if data.vocab_size > plain["model"]["vocab_size"]:
        raise ValueError(
            f"data.vocab_size={data.vocab_size} is larger than model.vocab_size="
            f"{plain['model']['vocab_size']}: the model could not embed every MQAR id"
        )
    # TrainConfig.data is the loop's data description: here MQARConfig (iterators given).
    cfg = TrainConfig.from_config({**plain, "data": {}})
    return dataclasses.replace(cfg, data=data), ev


def run_arm(cfg: TrainConfig, ev: mqar_report.MQAREval, workdir: str) -> dict[str, Any]:
    """Trains one arm into a fresh workdir and scores it: mqar_report.score + train info (and
    a MoE arm's report.expert_load)."""
    if os.path.isdir(workdir):
        shutil.rmtree(workdir)  # an old workdir would be resumed
    t0 = time.perf_counter()
    state = train(
        cfg,
        workdir,
        train_iterator=mqar.make_train_iterator(cfg.data),
        eval_batches=mqar.eval_batches(cfg.data, cfg.train.eval_batches),
    )
    seconds = time.perf_counter() - t0
    out = mqar_report.score(cfg.model, state.params, ev, cfg.data)
    curve = report.eval_curve(workdir)
    logging.warning("%s: accuracy %.3f, trained in %.0fs", workdir, out["accuracy"], seconds)
    info = {"train_seconds": seconds, "eval_loss": curve[-1][1] if curve else None}
    return out | report.expert_load(workdir) | info  # a MoE arm: its experts' load balance


def setup(cfg: TrainConfig, ev: mqar_report.MQAREval, seeds: int) -> dict[str, Any]:
    """experiments.setup_record plus the MQAR data and the scoring grid."""
    d = cfg.data
    return experiments.setup_record(cfg, seeds) | {
        "cells": ev.cells(),
        "examples": ev.examples,
        "distance_bins": ev.distance_bins,
        "vocab_size": d.vocab_size,
        "train_shapes": d.shapes(),
        "power_a": d.power_a,
    }


def save(results: dict[str, Any], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "mqar.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
    with open(os.path.join(out, "mqar.md"), "w") as f:
        f.write(mqar_report.markdown(results))
    mqar_report.plot(results, os.path.join(out, "mqar.png"))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    stray = [f"--{n}" for n in NOT_HERE if FLAGS[n].present]
    if stray:
        raise SystemExit(f"mqar.py: {stray} do not apply here (see the module docstring)")
    out = os.path.abspath(FLAGS.out)
    if FLAGS.replot:
        with open(os.path.join(out, "mqar.json")) as f:
            results = json.load(f)
        save(results, out)
        print(mqar_report.markdown(results))
        return
    arms = FLAGS.arms if FLAGS["arms"].present else list(DEFAULT_ARMS)
    seeds = FLAGS.seeds if FLAGS["seeds"].present else 1
    tiny = experiments.TINY_OVERRIDES | TINY_MQAR if FLAGS.tiny else {}
    overrides = tiny | experiments.parse_overrides(FLAGS.override, "mqar.py")
    work = os.path.join(out, "work")
    experiments.use_compilation_cache(work)
    t0, load0 = time.perf_counter(), os.getloadavg()
    results: dict[str, Any] = experiments.run_header() | {"arms": {}}
    try:
        for arm in arms:  # every arm's config is checked before anything trains
            arm_config(arm, overrides)
        for arm in arms:
            runs = []
            for seed in range(seeds):
                cfg, ev = arm_config(arm, overrides | {"train.seed": seed, "data.seed": seed})
                runs.append(run_arm(cfg, ev, os.path.join(work, f"{arm}_s{seed}")))
            agg = report.aggregate(runs, "accuracy") | report.aggregate_load(runs)
            results["arms"][arm] = agg | {"runs": runs}
            results["setup"] = setup(cfg, ev, seeds)
            results["seconds"] = time.perf_counter() - t0
            results["load_average"] = {"start": load0, "end": os.getloadavg()}
            save(results, out)
    except ValueError as e:
        raise SystemExit(f"mqar.py: {e}") from None
    if not FLAGS.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    print(mqar_report.markdown(results))
    print(f"wrote {out}/mqar.{{json,md,png}} in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    cli.run(main, "mqar.py")
