"""The cheap-conversion study (issue 36 item 4): experiment 3's Transformer -> Orthros
conversion (byte-level, T = 128, window 16) continued with only the scale-offsets, with SO +
LoRA r 8 / r 32, or with every parameter (configs/convert_cheap.py's arms), at equal steps,
each arm at its own best lr, then taught the passkey task and scored on recall beyond the window.

    python benchmarks/cheap_conversion.py --arms=so,lora8,lora32,full --seeds=0,1,2 \
        --lrs=1e-3,3e-3,1e-2,3e-2 --pretrain_steps=200 --steps=100 --passkey_steps=200 \
        --out=runs/cheap_conversion

One pretrained Transformer (configs/lm_convert.py:pretrain, --pretrain_steps), converted once
with identity scale-offsets. Per arm:
1. The lr sweep: --steps continuation updates at each of --lrs with the first seed (no --lrs:
   the arm's config lr only), scored by held-out nats/byte (arms.LM_EVAL; LoRA evaluated
   merged). The lowest wins.
2. The other seeds at that lr (train.seed s, data.seed 100 + s, as launch/experiments.py's
   conversion); the best lr's sweep run is the first seed's.
3. With --passkey_steps > 0, each seed's continued model gets the same passkey SFT stage
   (configs/recall_passkey.py's data, --passkey_steps updates at the arm's lr, its own trainable
   subset), then the recall experiment's score (arms.RECALL_EVAL: query accuracy per context
   length, 128 = the training context, 192 and 256 beyond it; window 16).
Per arm also its trainable parameters and AdamW state (from shapes). A run whose workdir
already holds its result (study.json) is not trained again, so a rerun with more --lrs trains
only the new ones; --out holds one setup (steps), and another setup there is refused. Writes
results.json and results.md under --out.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.run_record import run_record  # noqa: E402
from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.config.cli import load_config_file  # noqa: E402
from orthros_jax.convert import from_transformer  # noqa: E402
from orthros_jax.evaluation import evaluate  # noqa: E402
from orthros_jax.evaluation.arms import LM_EVAL, RECALL_EVAL  # noqa: E402
from orthros_jax.training import TrainConfig, init_train_state, make_optimizer, train  # noqa: E402
from orthros_jax.training.trainable import trainable_subset  # noqa: E402

QUIET = {"train.progress_bar": False, "train.checkpoint_every": 0, "train.eval_every": 0}
RESULT = "study.json"  # a finished run's score, in its workdir


def define_flags() -> None:
    flags.DEFINE_list("arms", ["so", "lora8", "lora32", "full"], "configs/convert_cheap.py arms.")
    flags.DEFINE_list("seeds", ["0", "1", "2"], "Continuation seeds; the sweep runs the first.")
    flags.DEFINE_list("lrs", [], "The lr sweep per arm (empty: each arm at its config's lr).")
    flags.DEFINE_integer("pretrain_steps", 200, "Transformer pretraining updates.")
    flags.DEFINE_integer("steps", 100, "Continuation updates per arm, lr and seed.")
    flags.DEFINE_integer("passkey_steps", 0, "Passkey SFT updates per arm and seed (0: none).")
    flags.DEFINE_string("out", "runs/cheap_conversion", "Output directory (workdirs inside).")


@dataclasses.dataclass(frozen=True)
class Study:
    """What the study runs (the flags, checked before anything compiles). lrs: the sweep, ()
    for each arm's config lr; passkey_steps 0: no passkey stage."""

    arms: tuple[str, ...]
    seeds: tuple[int, ...]
    lrs: tuple[float, ...] = ()
    pretrain_steps: int = 200
    steps: int = 100
    passkey_steps: int = 0

    def __post_init__(self) -> None:
        if not self.arms or not self.seeds:
            raise ValueError(f"--arms={self.arms} and --seeds={self.seeds} must be non-empty")
        for arm in self.arms:
            try:
                load_config_file(os.path.join(ROOT, "configs", f"convert_cheap.py:{arm}"))
            except ValueError as e:
                raise ValueError(f"--arms: {e}") from None
        for name, values in (("arms", self.arms), ("seeds", self.seeds), ("lrs", self.lrs)):
            if len(set(values)) < len(values):
                raise ValueError(f"--{name}={','.join(map(str, values))} repeats a value")
        if any(not 0.0 < lr < 1.0 for lr in self.lrs):
            raise ValueError(f"--lrs={','.join(map(str, self.lrs))}: each lr must be in (0, 1)")
        if min(self.pretrain_steps, self.steps) < 1 or self.passkey_steps < 0:
            raise ValueError(
                f"--pretrain_steps={self.pretrain_steps} and --steps={self.steps} must be >= 1,"
                f" --passkey_steps={self.passkey_steps} >= 0"
            )

    @classmethod
    def from_flags(cls, f: Any) -> Study:
        return cls(
            arms=tuple(f.arms),
            seeds=tuple(_numbers(f.seeds, int, "seeds")),
            lrs=tuple(_numbers(f.lrs, float, "lrs")),
            pretrain_steps=f.pretrain_steps,
            steps=f.steps,
            passkey_steps=f.passkey_steps,
        )

    def setup(self) -> dict[str, int]:
        """What the runs in one --out share: a rerun must have the same."""
        return dict(
            pretrain_steps=self.pretrain_steps, steps=self.steps, passkey_steps=self.passkey_steps
        )


def _numbers(items: Sequence[str], kind: Callable[[str], Any], name: str) -> list[Any]:
    try:
        return [kind(x) for x in items]
    except ValueError:
        raise ValueError(f"--{name}={','.join(items)}: not a list of {kind.__name__}") from None


def config(spec: str, data_from: str | None = None, **overrides: Any) -> TrainConfig:
    """TrainConfig of configs/<spec> with dotted-key overrides; data_from: a config file whose
    data section replaces spec's."""
    c = load_config_file(os.path.join(ROOT, "configs", spec))
    if data_from is not None:
        c.data = load_config_file(os.path.join(ROOT, "configs", data_from)).data
    c.update_from_flattened_dict(overrides)
    return TrainConfig.from_config(c)


def arm_config(arm: str, lr: float | None, seed: int, steps: int, converted: str) -> TrainConfig:
    """The arm's continuation from the converted model (lr None: its config's)."""
    extra = {"train.seed": seed, "data.seed": 100 + seed, "train.steps": steps}
    extra |= {} if lr is None else {"optimizer.lr": lr}
    return config(f"convert_cheap.py:{arm}", **QUIET, **extra, init_from=converted)


def passkey_config(arm: str, lr: float, seed: int, steps: int, continued: str) -> TrainConfig:
    """The passkey SFT stage of one continued model: recall_passkey.py's data (the same for
    every arm), the arm's trainable subset and optimizer at lr."""
    extra = {"train.seed": seed, "data.seed": seed, "train.steps": steps, "optimizer.lr": lr}
    return config(
        f"convert_cheap.py:{arm}",
        data_from="recall_passkey.py:orthros",
        **QUIET,
        **extra,
        init_from=continued,
    )


def nll(model_dir: str) -> float:
    loaded = checkpoint.load_model(model_dir)  # merged
    return float(evaluate(loaded.cfg, loaded.params, LM_EVAL, None)["lm"]["nll"])


def recall(model_dir: str, digits: int) -> dict[str, Any]:
    """The recall experiment's passkey score: accuracy overall and per context length."""
    loaded = checkpoint.load_model(model_dir)
    spec = RECALL_EVAL.replace(passkey_digits=digits)
    res = evaluate(loaded.cfg, loaded.params, spec, loaded.tokenizer_file)["passkey"]
    return {k: res[k] for k in ("accuracy", "accuracy_by_length")}


def run(cfg: TrainConfig, workdir: str, score: Callable[[str], Any]) -> Any:
    """score(workdir) after training cfg there; a workdir holding its score is reused."""
    done = os.path.join(workdir, RESULT)
    if os.path.isfile(done):
        with open(done) as fh:
            return json.load(fh)
    if os.path.isdir(workdir):  # unfinished: an old workdir would be resumed
        shutil.rmtree(workdir)
    train(cfg, workdir)
    result = score(workdir)
    with open(done, "w") as fh:
        json.dump(result, fh)
    return result


def footprint(cfg: TrainConfig) -> tuple[int, int]:
    """(trainable parameters, AdamW state bytes) of the run, from shapes."""
    subset = trainable_subset(cfg.model, cfg.train.trainable)
    tx = make_optimizer(cfg.optimizer, cfg.train.steps, cfg.model)
    init = lambda r: init_train_state(cfg.model, tx, r, None, subset)
    state = jax.eval_shape(init, jax.random.PRNGKey(0))
    trained, _ = subset.split(state.params)
    n = sum(math.prod(a.shape) for a in jax.tree.leaves(trained))
    return n, sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(state.opt_state))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def study_arm(s: Study, arm: str, out: str, converted: str) -> dict[str, Any]:
    """One arm: its lr sweep, its seeds at the best lr, their passkey stage."""
    name = lambda lr, seed: os.path.join(out, arm, f"lr{lr:g}_s{seed}")
    lrs = s.lrs or (config(f"convert_cheap.py:{arm}").optimizer.lr,)
    first = s.seeds[0]
    sweep = {
        lr: run(arm_config(arm, lr, first, s.steps, converted), name(lr, first), nll) for lr in lrs
    }
    best = min(sweep, key=sweep.__getitem__)
    runs = [sweep[best]]
    for seed in s.seeds[1:]:
        runs.append(run(arm_config(arm, best, seed, s.steps, converted), name(best, seed), nll))
    trainable, opt = footprint(arm_config(arm, best, first, s.steps, converted))
    mean, std = mean_std(runs)
    result = dict(lr=best, sweep={f"{lr:g}": v for lr, v in sweep.items()}, nll=mean, std=std)
    result |= dict(runs=runs, trainable=trainable, opt_bytes=opt)
    if s.passkey_steps:
        scores = []
        for seed in s.seeds:
            cfg = passkey_config(arm, best, seed, s.passkey_steps, name(best, seed))
            score = functools.partial(recall, digits=cfg.data.recall_passkey_digits)
            scores.append(run(cfg, name(best, seed) + "_passkey", score))
        result["passkey"] = scores
    print(f"{arm}: lr {best:g}, {mean:.3f} ± {std:.3f} {runs}", flush=True)
    return result


def markdown(results: dict[str, Any]) -> str:
    """The sweep table (first seed, per lr) and the final table (best lr, every seed)."""
    arms = results["arms"]
    lrs = list(dict.fromkeys(lr for r in arms.values() for lr in r["sweep"]))
    rows = [
        "| arm | " + " | ".join(f"lr {lr}" for lr in lrs) + " | best |",
        "|---|" + "---:|" * len(lrs) + "---:|",
    ]
    for arm, r in arms.items():
        cells = [f"{r['sweep'][lr]:.3f}" if lr in r["sweep"] else "—" for lr in lrs]
        rows.append(f"| {arm} | " + " | ".join(cells) + f" | {r['lr']:g} |")
    lengths = [n for n in RECALL_EVAL.context_lengths]
    passkey = all("passkey" in r for r in arms.values())
    head = "| arm | lr | held-out nats/byte | per seed | trainable params | AdamW state |"
    rows += ["", head + ("".join(f" passkey T={n} |" for n in lengths) if passkey else "")]
    rows.append("|---|---:|---|---|---:|---:|" + ("---|" * len(lengths) if passkey else ""))
    for arm, r in arms.items():
        seeds = ", ".join(f"{x:.3f}" for x in r["runs"])
        row = (
            f"| {arm} | {r['lr']:g} | {r['nll']:.3f} ± {r['std']:.3f} | {seeds} | "
            f"{r['trainable']:,} | {r['opt_bytes'] / 2**10:.1f} KiB |"
        )
        for n in lengths if passkey else ():
            m, sd = mean_std([p["accuracy_by_length"][str(n)] for p in r["passkey"]])
            row += f" {m:.2f} ± {sd:.2f} |"
        rows.append(row)
    return "\n".join(rows) + "\n"


def claim(out: str, s: Study) -> str:
    """Makes `out` the study's directory (its setup in setup.json); ValueError when it holds
    runs of another setup, which would be reused."""
    os.makedirs(out, exist_ok=True)
    setup_file = os.path.join(out, "setup.json")
    if os.path.isfile(setup_file):
        with open(setup_file) as fh:
            if (old := json.load(fh)) != s.setup():
                raise ValueError(f"--out={out} holds a study with {old}; use another --out")
    with open(setup_file, "w") as fh:
        json.dump(s.setup(), fh)
    return out


def main(argv: list[str]) -> None:
    del argv
    t0 = time.perf_counter()
    s = Study.from_flags(flags.FLAGS)
    out = claim(os.path.abspath(flags.FLAGS.out), s)
    pre = os.path.join(out, "pretrain")
    if not os.path.isdir(os.path.join(pre, checkpoint.CHECKPOINTS_DIR)):
        train(config("lm_convert.py:pretrain", **QUIET, **{"train.steps": s.pretrain_steps}), pre)
    loaded = checkpoint.load_model(pre)
    window = config("convert_cheap.py:full").model.window
    cfg, params = from_transformer(loaded.params, loaded.cfg, window=window, scale_offset=True)
    converted = os.path.join(out, "converted")
    checkpoint.save_model(converted, cfg, params, loaded.tokenizer_file)
    results: dict[str, Any] = {"pretrain_nll": nll(pre), "converted_nll": nll(converted)}
    results["arms"] = {arm: study_arm(s, arm, out, converted) for arm in s.arms}
    results["setup"] = dataclasses.asdict(s) | {"window": window}
    results |= run_record(t0)
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=2)
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    define_flags()
    app.run(main)
