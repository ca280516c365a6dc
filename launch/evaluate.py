"""Evaluate any checkpoint of any arm: held-out NLL / bits-per-byte and synthetic recall.

    python launch/evaluate.py --model=runs/tiny --out=runs/tiny_eval
    python launch/evaluate.py --model=runs/recall_orthros --out=/tmp/ev --tasks=passkey,mqar \
        --context_lengths=128,256,512 --depths=0,0.5,1 --samples=8 --decode=greedy

--model is a model directory (launch/convert.py, checkpoint.save_model) or a training workdir
(its newest checkpoint). Writes only into --out: metrics.json, and niah_<task>.png per recall
task. Use the training run's corpus / validation_fraction / seq_len for --tasks=lm, so the
split scored is the held-out one.
"""

from __future__ import annotations

import json

from absl import app, flags, logging

from orthros_jax.evaluation import TASKS, EvalSpec, evaluate_model_dir

_MODEL = flags.DEFINE_string("model", None, "Model directory or training workdir.")
_OUT = flags.DEFINE_string("out", None, "Output directory (metrics.json, heatmaps).")
_TASKS = flags.DEFINE_list("tasks", ["lm", "passkey"], f"Any of {', '.join(TASKS)}.")
_DECODE = flags.DEFINE_enum(
    "decode", "teacher_forced", ["teacher_forced", "greedy"], "How recall answers are predicted."
)
_BATCH = flags.DEFINE_integer("batch_size", 16, "Rows per evaluation batch.")
_CORPUS = flags.DEFINE_list("corpus", ["embedded"], "lm: corpus sources (as in DataConfig).")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 256, "lm: tokens per row.")
_LM_BATCHES = flags.DEFINE_integer("lm_batches", 8, "lm: held-out batches to score.")
_VAL_FRAC = flags.DEFINE_float("validation_fraction", 0.05, "lm: held-out share of documents.")
_LENGTHS = flags.DEFINE_list(
    "context_lengths", [], "Recall context lengths (default 2/4/8/16 x window)."
)
_DEPTHS = flags.DEFINE_list("depths", ["0", "0.25", "0.5", "0.75", "1"], "Passkey depths.")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Recall examples per grid cell.")
_SEED = flags.DEFINE_integer("seed", 0, "Recall example seed.")
_PAIRS = flags.DEFINE_integer("mqar_pairs", 8, "mqar: key-value pairs per example.")
_QUERIES = flags.DEFINE_integer("mqar_queries", 4, "mqar: queries per example.")
_GAP = flags.DEFINE_integer("mqar_gap", 0, "mqar: min tokens pair -> query (0 = 2 x window).")
_DIGITS = flags.DEFINE_integer("passkey_digits", 5, "passkey: digits of the key (as trained).")
_FILLER = flags.DEFINE_enum("filler", "fixed", ["fixed", "pydoc"], "Recall filler text.")
flags.mark_flags_as_required(["model", "out"])


def spec_from_flags() -> EvalSpec:
    """The EvalSpec the command line describes (ValueError on bad values)."""
    try:
        lengths = tuple(int(n) for n in _LENGTHS.value)
        depths = tuple(float(d) for d in _DEPTHS.value)
    except ValueError as e:
        raise ValueError(f"--context_lengths / --depths must be numbers: {e}") from None
    return EvalSpec(
        tasks=tuple(_TASKS.value),
        decode=_DECODE.value,
        batch_size=_BATCH.value,
        lm_corpus=tuple(_CORPUS.value),
        lm_seq_len=_SEQ_LEN.value,
        lm_batches=_LM_BATCHES.value,
        lm_validation_fraction=_VAL_FRAC.value,
        context_lengths=lengths,
        depths=depths,
        samples=_SAMPLES.value,
        seed=_SEED.value,
        mqar_pairs=_PAIRS.value,
        mqar_queries=_QUERIES.value,
        mqar_gap=_GAP.value,
        passkey_digits=_DIGITS.value,
        filler=_FILLER.value,
    )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax is chatty at INFO
    try:
        results = evaluate_model_dir(_MODEL.value, _OUT.value, spec_from_flags())
    except ValueError as e:  # user-facing errors: the message, no traceback
        raise SystemExit(f"evaluate.py: {e}") from None
    summary = {
        task: {k: v for k, v in results[task].items() if k in ("nll", "bpb", "accuracy")}
        for task in TASKS
        if task in results
    }
    print(json.dumps(summary, indent=2))
    print(f"wrote {_OUT.value}/metrics.json ({results['seconds']:.1f}s)")


if __name__ == "__main__":
    app.run(main)
