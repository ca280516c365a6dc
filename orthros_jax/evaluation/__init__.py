"""Evaluation of any checkpoint of any arm: language modelling, synthetic recall and
lm-evaluation-harness tasks.

    from orthros_jax import evaluation
    metrics = evaluation.evaluate_model_dir("runs/tiny", "out/", evaluation.EvalSpec())

`metrics` holds the metric functions (pure, tested on hand examples); `suite` runs a set
of tasks on a loaded model and writes metrics.json (+ a NIAH heatmap PNG per recall task).
`harness` is the lm-eval model (`--model orthros_jax`; imported on demand, it needs the `eval`
extra), `scoring` its SFT-mode continuation scoring, `harness_run` runs lm-eval tasks on a
loaded model, and `job` is what launch/evaluate.py runs (suite and/or harness tasks).
"""

from orthros_jax.evaluation import report
from orthros_jax.evaluation.harness_run import HarnessSpec, run_harness
from orthros_jax.evaluation.job import EvalJob, run_job
from orthros_jax.evaluation.metrics import (
    DECODES,
    answer_tokens,
    bits_per_byte,
    greedy_predictions,
    grid_matrix,
    lm_metrics,
    masked_nll_sums,
    plot_heatmap,
    query_correct,
    recall_records,
    summarize_records,
    teacher_forced_predictions,
    token_bytes,
)
from orthros_jax.evaluation.suite import (
    TASKS,
    EvalSpec,
    evaluate,
    evaluate_model_dir,
    recall_examples,
    write_results,
)

__all__ = [
    "answer_tokens",
    "DECODES",
    "TASKS",
    "EvalJob",
    "EvalSpec",
    "HarnessSpec",
    "bits_per_byte",
    "evaluate",
    "evaluate_model_dir",
    "grid_matrix",
    "greedy_predictions",
    "lm_metrics",
    "masked_nll_sums",
    "plot_heatmap",
    "query_correct",
    "recall_examples",
    "report",
    "run_harness",
    "run_job",
    "recall_records",
    "summarize_records",
    "teacher_forced_predictions",
    "token_bytes",
    "write_results",
]
