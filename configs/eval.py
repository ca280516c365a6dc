"""launch/evaluate.py's job: our task suite and/or lm-evaluation-harness tasks (the default job).

    python launch/evaluate.py --model=runs/tiny --out=runs/tiny_eval          # lm + passkey
    python launch/evaluate.py --model=runs/x --out=/tmp/ev --config.tasks=passkey \
        --config.passkey_digits=2 --config.context_lengths=128,192,256 --config.decode=greedy
    python launch/evaluate.py --model=runs/x --out=/tmp/ev --config.tasks= \
        --config.harness.tasks=arc_easy,piqa --config.harness.limit=100

Top level: the fields of orthros_jax.evaluation.EvalSpec (tasks: any of lm, passkey, mqar;
empty = none). harness: the fields of orthros_jax.evaluation.HarnessSpec (tasks: lm-eval task,
group or tag names, comma-separated). Every field can be overridden with --config.<key>=...
"""

import ml_collections

from orthros_jax.config.cli import section
from orthros_jax.evaluation.harness_run import HarnessSpec
from orthros_jax.evaluation.suite import EvalSpec


def get_config() -> ml_collections.ConfigDict:
    c = section(EvalSpec())
    c.harness = section(HarnessSpec())
    return c
