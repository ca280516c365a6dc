"""The paper's lm-evaluation-harness task lists (zero-shot), for a converted or trained model.

    python launch/evaluate.py --model=runs/llama_orthros --out=runs/llama_orthros_eval \
        --config=configs/eval_paper.py                     # Table 1: seven commonsense tasks
    python launch/evaluate.py --model=runs/x --out=/tmp/ev --config=configs/eval_paper.py:table2

table1: ARC-e, ARC-c, HellaSwag, PIQA, OBQA, SIQA, WinoGrande (Tables 1 and 7's commonsense
tasks). table2: the same plus MMLU (Table 2, the 8B conversions). The datasets come from the
Hugging Face Hub (lm-eval downloads them on first use; offline, a missing one fails with its
name). Our own suite is off; add it back with --config.tasks=lm,passkey.
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file

TABLE1 = (
    "arc_easy",
    "arc_challenge",
    "hellaswag",
    "piqa",
    "openbookqa",
    "social_iqa",
    "winogrande",
)
TABLES = {"table1": TABLE1, "table2": (*TABLE1, "mmlu")}


def get_config(table: str = "table1") -> ml_collections.ConfigDict:
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; allowed: {', '.join(TABLES)}")
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, "eval.py"))
    c.tasks = ()
    c.harness.tasks = TABLES[table]
    c.harness.num_fewshot = 0
    return c
