"""Evaluation of any checkpoint of any arm: language modelling and synthetic recall.

    from orthros_jax import evaluation
    metrics = evaluation.evaluate_model_dir("runs/tiny", "out/", evaluation.EvalSpec())

`metrics` holds the metric functions (pure, tested on hand examples); `suite` runs a set
of tasks on a loaded model and writes metrics.json (+ a NIAH heatmap PNG per recall task).
"""

from orthros_jax.evaluation import report
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
    "EvalSpec",
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
    "recall_records",
    "summarize_records",
    "teacher_forced_predictions",
    "token_bytes",
    "write_results",
]
