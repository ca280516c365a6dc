"""Evaluate any checkpoint of any arm: our suite (held-out NLL, synthetic recall) and/or
lm-evaluation-harness tasks.

    python launch/evaluate.py --model=runs/tiny --out=runs/tiny_eval
    python launch/evaluate.py --model=runs/recall_orthros --out=/tmp/ev \
        --config.tasks=passkey,mqar --config.context_lengths=128,256,512 --config.depths=0,0.5,1 \
        --config.samples=8 --config.decode=greedy
    python launch/evaluate.py --model=runs/llama_orthros --out=/tmp/ev \
        --config=configs/eval_paper.py


--model is a model directory (launch/convert.py, checkpoint.save_model) or a training workdir
(its newest checkpoint). --config is a file with get_config() (default configs/eval.py; its
docstring lists the keys). Writes only into --out: metrics.json, niah_<task>.png per recall
task, and harness_results.json when harness tasks ran. Use the training run's corpus /
validation_fraction / seq_len for the lm task, so the split scored is the held-out one.
"""

from __future__ import annotations

import json
import os

from absl import app, flags, logging

from orthros_jax.config import cli
from orthros_jax.evaluation import TASKS
from orthros_jax.evaluation.job import EvalJob, run_job

CONFIG_FILE = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "eval.py")
)


_CONFIG = cli.define_config_flag(
    CONFIG_FILE, "Evaluation config file (get_config()).", "evaluate.py"
)
_MODEL = flags.DEFINE_string("model", None, "Model directory or training workdir.")
_OUT = flags.DEFINE_string("out", None, "Output directory (metrics.json, heatmaps, harness).")
flags.mark_flags_as_required(["model", "out"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax is chatty at INFO
    try:
        job = EvalJob.from_config(_CONFIG.value)
        results = run_job(_MODEL.value, _OUT.value, job)
    except ValueError as e:  # user-facing errors: the message, no traceback
        raise SystemExit(f"evaluate.py: {e}") from None
    summary = {
        task: {k: v for k, v in results[task].items() if k in ("nll", "bpb", "accuracy")}
        for task in TASKS
        if task in results
    }
    if "harness" in results:
        summary["harness"] = results["harness"]["tasks"]
    print(json.dumps(summary, indent=2))
    print(f"wrote {_OUT.value}/metrics.json ({results['seconds']:.1f}s)")


if __name__ == "__main__":
    cli.run(main, "evaluate.py")
