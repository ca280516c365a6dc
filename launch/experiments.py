"""The evidence experiments: recall beyond the window, byte-level LM, Transformer conversion.

    python launch/experiments.py --out=runs/exp                      # all three, full size
    python launch/experiments.py --out=runs/exp --experiments=lm     # one of them
    python launch/experiments.py --out=/tmp/exp --tiny               # seconds (the tests)

1. recall   configs/recall_passkey.py:<arm>: train each arm on passkey retrieval at context
            8 x window, score query accuracy (teacher-forced argmax) over lengths x depths.
2. lm       configs/lm_byte.py:<arm>: equal steps on the embedded corpus, held-out NLL per
            arm, --seeds seeds (mean +- std); MoE arms also their experts' load balance.
3. convert  configs/lm_convert.py:<stage>: pretrain a Transformer; convert it
            (convert.from_transformer, window < T) and continue; continue the Transformer
            for the same steps (base CPT). Held-out NLL before/after, per seed.

Arms (--arms): by default the four attention arms transformer, swa, orthros, orthros_noso
(scale_offset=False), those of results/results.md. The gated-DeltaNet arms are opt-in via
--arms=gdn,hybrid,orthros_h (recall only: lm and convert have no GDN arms), and so are fla's
gla and retnet and the mixture-of-experts arms transformer_moe, orthros_moe and
orthros_moe_independent (recall and lm). Everything goes into
--out: results.json, results.md, results.png (a panel per experiment), results_niah.png
(recall heatmaps per arm) and work/<experiment>/<run>/ (training workdirs, the converted
model, per-run evaluation outputs and heatmaps). Rerunning with a subset of --experiments
keeps the other experiments' results already in --out/results.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import app, flags, logging

from orthros_jax import checkpoint
from orthros_jax.config import cli
from orthros_jax.convert import from_transformer
from orthros_jax.evaluation import EvalSpec, arms, evaluate, report, write_results
from orthros_jax.evaluation.arms import LM_EVAL, RECALL_EVAL
from orthros_jax.training import TrainConfig, train

# The arms each experiment may run and runs by default: orthros_jax/evaluation/arms.py.
ARMS = arms.arms_for(arms.RECALL)
DEFAULT_ARMS = arms.arms_for(arms.RECALL, default=True)
LM_ARMS = arms.arms_for(arms.LM)  # configs/lm_byte.py's
CONVERT_ARMS = arms.arms_for(arms.CONVERT)  # configs/lm_convert.py's stages
EXPERIMENTS = (arms.RECALL, arms.LM, arms.CONVERT)
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")

_OUT = flags.DEFINE_string("out", None, "Output directory (results.*, work/).")
_EXPERIMENTS = flags.DEFINE_list("experiments", list(EXPERIMENTS), "Which experiments to run.")
_ARMS = flags.DEFINE_list(
    "arms",
    list(DEFAULT_ARMS),
    f"Arms of the recall and lm experiments, of {list(ARMS)} (lm: those of {list(LM_ARMS)}).",
)
_SEEDS = flags.DEFINE_integer("seeds", 3, "lm: seeds per arm.")
_RECALL_SEEDS = flags.DEFINE_integer("recall_seeds", 2, "recall: seeds per arm.")
_CONVERT_SEEDS = flags.DEFINE_integer("convert_seeds", 3, "convert: continuation seeds.")
_CONVERT_ARMS = flags.DEFINE_list(
    "convert_arms",
    list(arms.arms_for(arms.CONVERT, default=True)),
    f"convert: continuation stages to run, of {list(CONVERT_ARMS)}.",
)
_TINY = flags.DEFINE_bool("tiny", False, "A few steps of a tiny model (tests, smoke runs).")
_OVERRIDE = flags.DEFINE_multi_string(
    "override", [], "key=value applied to every training config, e.g. train.steps=50."
)
_KEEP = flags.DEFINE_bool("keep_work", True, "Keep work/ (checkpoints) after the run.")
_REPLOT = flags.DEFINE_bool(
    "replot", False, "Only rewrite results.md / *.png from --out/results.json (no training)."
)
flags.mark_flag_as_required("out")

# Shrinks every run to seconds: used by --tiny (the tests) and nothing else.
TINY_OVERRIDES = {
    "model.n_layers": 1,  # compiles ~5s faster than 2 on CPU; both streams still run
    "model.d_model": 32,
    "model.n_heads": 2,
    "model.n_kv_heads": 1,
    "model.head_dim": 16,
    "model.d_ff": 64,
    "data.batch_size": 2,
    "train.steps": 2,
    "train.eval_batches": 1,
    "train.eval_every": 0,
    "train.log_every": 1,
    # One optimizer for every stage: equal programs hit the compilation cache across stages.
    "optimizer.lr": 1e-3,
    "optimizer.warmup_steps": 1,
}
TINY_EVAL = {"samples": 1, "depths": (0.0, 1.0), "context_lengths": (128,), "lm_batches": 1}


def parse_value(text: str) -> Any:
    """'3' -> 3, '1e-3' -> 0.001, 'true' -> True, anything else stays a string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_overrides(items: list[str], tool: str) -> dict[str, Any]:
    """--override values ("key=value") -> {key: parse_value(value)}; SystemExit naming `tool`
    for an item without "="."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"{tool}: --override needs key=value, got {item!r}")
        overrides[key] = parse_value(value)
    return overrides


def use_compilation_cache(work: str) -> None:
    """A persistent compilation cache in work/jax_cache: seeds of one arm compile the same
    programs, and the cache skips recompiling them."""
    jax.config.update("jax_compilation_cache_dir", os.path.join(work, "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def run_header() -> dict[str, str]:
    """The "command" and "devices" entries of a results file."""
    return {
        "command": " ".join(["python", *sys.argv]),
        "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
    }


def setup_record(cfg: TrainConfig, seeds: int) -> dict[str, Any]:
    """The training setup a results file records: budget, shapes, model size, lr, seeds."""
    m, d = cfg.model, cfg.data
    return {
        "steps": cfg.train.steps,
        "seeds": seeds,
        "seq_len": d.seq_len,
        "batch_size": d.batch_size,
        "window": m.window,
        "model": f"d={m.d_model} L={m.n_layers} N={m.n_heads} K={m.n_kv_heads} F={m.d_ff}",
        "lr": cfg.optimizer.lr,
    }


class Driver:
    """Runs experiments into one output directory; keeps the results dict as it goes."""

    def __init__(self, out: str, tiny: bool, overrides: Mapping[str, Any]) -> None:
        self.out = os.path.abspath(out)
        self.work = os.path.join(self.out, "work")
        self.tiny = tiny
        self.overrides = {**(TINY_OVERRIDES if tiny else {}), **overrides}
        self.results: dict[str, Any] = {}
        previous = os.path.join(self.out, "results.json")
        if os.path.isfile(previous):  # rerunning one experiment keeps the others' results
            with open(previous) as f:
                old = json.load(f)
            self.results = {k: v for k, v in old.items() if k in EXPERIMENTS}

    # ------------------------------------------------------------ helpers
    def config(self, spec: str, **extra: Any) -> TrainConfig:
        """TrainConfig of configs/<spec> with the driver's overrides and `extra` (dotted keys)."""
        c = cli.load_config_file(os.path.join(CONFIG_DIR, spec))
        c.update_from_flattened_dict({**self.overrides, **extra})
        return TrainConfig.from_config(c)

    def spec(self, base: EvalSpec) -> EvalSpec:
        if not self.tiny:
            return base
        return base.replace(**{k: v for k, v in TINY_EVAL.items() if hasattr(base, k)})

    def train(self, cfg: TrainConfig, name: str) -> str:
        """Trains into work/<name> (fresh: an old workdir would be resumed) and returns it."""
        workdir = os.path.join(self.work, name)
        if os.path.isdir(workdir):
            shutil.rmtree(workdir)
        t0 = time.perf_counter()
        train(cfg, workdir)
        logging.warning("trained %s in %.0fs", name, time.perf_counter() - t0)
        return workdir

    def evaluate(self, model_dir: str, spec: EvalSpec, name: str) -> dict[str, Any]:
        loaded = checkpoint.load_model(model_dir)
        res = evaluate(loaded.cfg, loaded.params, spec, loaded.tokenizer_file)
        write_results(res, os.path.join(self.work, name, "eval"), title=name)
        return res

    def save(self) -> None:
        """results.json / results.md / results.png, rewritten after every experiment."""
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump(self.results, f, indent=2, sort_keys=True)
        with open(os.path.join(self.out, "results.md"), "w") as f:
            f.write(report.markdown(self.results))
        report.plot(self.results, os.path.join(self.out, "results.png"))
        report.plot_recall_heatmaps(self.results, os.path.join(self.out, "results_niah.png"))

    # ------------------------------------------------------------ experiments
    def recall(self, arms: list[str], seeds: int) -> None:
        first = self.config(f"recall_passkey.py:{arms[0]}")
        spec = self.spec(RECALL_EVAL).replace(passkey_digits=first.data.recall_passkey_digits)
        t0, out = time.perf_counter(), {}
        for arm in arms:
            runs = []
            for seed in range(seeds):
                cfg = self.config(
                    f"recall_passkey.py:{arm}", **{"train.seed": seed, "data.seed": seed}
                )
                name = f"recall/{arm}_s{seed}"
                res = self.evaluate(self.train(cfg, name), spec, name)["passkey"]
                runs.append(
                    {
                        k: res[k]
                        for k in ("accuracy", "token_accuracy", "accuracy_by_length", "grid")
                    }
                )
            out[arm] = report.aggregate(runs, "accuracy") | {"runs": runs}
        self.results["recall"] = {
            "arms": out,
            "setup": {
                "train_context": first.data.context_len,
                "window": first.model.window,
                "steps": first.train.steps,
                "seeds": seeds,
                "digits": first.data.recall_passkey_digits,
                "eval": {k: getattr(spec, k) for k in ("context_lengths", "depths", "samples")},
            },
            "seconds": time.perf_counter() - t0,
        }

    def lm(self, arms: list[str], seeds: int) -> None:
        spec = self.spec(LM_EVAL)
        t0, out = time.perf_counter(), {}
        for arm in arms:
            runs = []
            for seed in range(seeds):
                cfg = self.config(f"lm_byte.py:{arm}", **{"train.seed": seed, "data.seed": seed})
                spec_s = spec.replace(lm_seq_len=cfg.data.seq_len)
                name = f"lm/{arm}_s{seed}"
                workdir = self.train(cfg, name)
                # A MoE arm's runs also record the experts' load balance at the end of training.
                runs.append(
                    self.evaluate(workdir, spec_s, name)["lm"] | report.expert_load(workdir)
                )
            agg = report.aggregate(runs, "nll") | report.aggregate_load(runs)
            out[arm] = agg | {"bpb_mean": float(np.mean([r["bpb"] for r in runs])), "runs": runs}
        first = self.config(f"lm_byte.py:{arms[0]}")
        self.results["lm"] = {
            "arms": out,
            "setup": setup_record(first, seeds),
            "seconds": time.perf_counter() - t0,
        }

    def convert(self, stages: list[str], seeds: int) -> None:
        spec = self.spec(LM_EVAL)
        t0 = time.perf_counter()
        pre_cfg = self.config("lm_convert.py:pretrain")
        spec = spec.replace(lm_seq_len=pre_cfg.data.seq_len)
        pre_dir = self.train(pre_cfg, "convert/pretrain")
        base = pre_cfg.model.architecture  # the single-stream arm the others convert from
        before = {base: self.evaluate(pre_dir, spec, "convert/pretrain")["lm"]}
        init = {base: pre_dir}
        loaded = checkpoint.load_model(pre_dir)
        for stage in stages:
            if stage == base:
                continue
            target = self.config(f"lm_convert.py:{stage}").model
            cfg, params = from_transformer(
                loaded.params,
                loaded.cfg,
                window=target.window,
                scale_offset=target.scale_offset,
            )
            init[stage] = os.path.join(self.work, "convert", f"{stage}_converted")
            checkpoint.save_model(init[stage], cfg, params, loaded.tokenizer_file)
            before[stage] = self.evaluate(init[stage], spec, f"convert/{stage}_converted")["lm"]
        out = {}
        for stage in stages:
            runs, curves = [], []
            for seed in range(seeds):
                cfg = self.config(
                    f"lm_convert.py:{stage}",
                    **{"init_from": init[stage], "train.seed": seed, "data.seed": 100 + seed},
                )
                name = f"convert/{stage}_s{seed}"
                workdir = self.train(cfg, name)
                runs.append(self.evaluate(workdir, spec, name)["lm"])
                curves.append(report.eval_curve(workdir))
            out[stage] = report.aggregate(runs, "nll") | {
                "before": before[stage],
                "runs": runs,
                "curves": curves,
            }
        self.results["convert"] = {
            "arms": out,
            "pretrain": before[base],
            "setup": setup_record(pre_cfg, seeds)
            | {
                "pretrain_steps": pre_cfg.train.steps,
                "continue_steps": self.config(f"lm_convert.py:{stages[0]}").train.steps,
            },
            "seconds": time.perf_counter() - t0,
        }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    bad = [e for e in _EXPERIMENTS.value if e not in EXPERIMENTS]
    bad += [a for a in _ARMS.value if a not in ARMS]
    bad += [a for a in _CONVERT_ARMS.value if a not in CONVERT_ARMS]
    if bad:
        raise SystemExit(f"experiments.py: unknown experiment/arm(s) {bad}")
    driver = Driver(_OUT.value, _TINY.value, parse_overrides(_OVERRIDE.value, "experiments.py"))
    if _REPLOT.value:
        with open(os.path.join(driver.out, "results.json")) as f:
            driver.results = json.load(f)
        driver.save()
        print(report.markdown(driver.results))
        return
    use_compilation_cache(driver.work)  # inside --out
    t0 = time.perf_counter()
    driver.results.update(run_header())
    try:
        for exp in EXPERIMENTS:  # fixed order: cheap, informative ones first
            if exp not in _EXPERIMENTS.value:
                continue
            if exp == arms.RECALL:
                driver.recall(_ARMS.value, _RECALL_SEEDS.value)
            elif exp == arms.LM:
                driver.lm([a for a in _ARMS.value if a in LM_ARMS], _SEEDS.value)
            else:
                driver.convert(_CONVERT_ARMS.value, _CONVERT_SEEDS.value)
            driver.results["seconds"] = time.perf_counter() - t0
            driver.save()
    except ValueError as e:
        raise SystemExit(f"experiments.py: {e}") from None
    if not _KEEP.value:
        shutil.rmtree(driver.work, ignore_errors=True)
    print(report.markdown(driver.results))
    print(f"wrote {driver.out}/results.{{json,md,png}} in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    cli.run(main, "experiments.py")
