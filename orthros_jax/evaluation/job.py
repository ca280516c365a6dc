"""What launch/evaluate.py runs: our task suite and/or lm-evaluation-harness tasks on one model.

Config file (configs/eval.py, `get_config()`): the fields of `EvalSpec` at the top level
(`tasks` may be empty: no suite tasks) and a `harness` section with the fields of
`HarnessSpec`. `EvalJob.from_config` turns it into frozen dataclasses once; unknown keys fail
with the valid ones listed. Everything a job writes goes into one output directory:
metrics.json (suite results, plus a "harness" summary), niah_<task>.png per recall task, and
harness_results.json (lm-eval's own results) when harness tasks ran.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

from orthros_jax.config.cli import dataclass_from_dict, to_plain
from orthros_jax.evaluation.harness_run import HarnessSpec, split_names
from orthros_jax.evaluation.suite import EvalSpec, evaluate, write_results


@dataclasses.dataclass(frozen=True)
class EvalJob:
    """suite: our tasks (None when the config names none); harness: lm-eval tasks."""

    suite: EvalSpec | None
    harness: HarnessSpec

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EvalJob:
        """Builds the job from a (locked) ml_collections config; ValueError on unknown keys,
        bad values, or a job with nothing to evaluate."""
        plain = dict(to_plain(config))
        for key in ("tasks", "harness"):
            if key not in plain:
                raise ValueError(f"the eval config has no {key!r} key (see configs/eval.py)")
        harness = dataclass_from_dict(HarnessSpec, plain.pop("harness"), "harness")
        tasks = split_names(plain.pop("tasks"))
        if "lm_corpus" in plain:
            plain["lm_corpus"] = split_names(plain["lm_corpus"])
        # Validated even when no suite task runs, so a typo never passes silently.
        suite = dataclass_from_dict(EvalSpec, {**plain, "tasks": tasks or ("lm",)}, "config")
        if not tasks and not harness.tasks:
            raise ValueError(
                "nothing to evaluate: set tasks (lm, passkey, mqar) and/or harness.tasks"
            )
        return cls(suite=suite if tasks else None, harness=harness)


def run_job(model_dir: str, out_dir: str, job: EvalJob) -> dict[str, Any]:
    """Loads a model directory or training workdir, runs the job's harness tasks (first, so a
    missing dataset fails before the suite's work), then its suite, and writes out_dir."""
    from orthros_jax.checkpoint import load_model

    t0 = time.perf_counter()
    loaded = load_model(model_dir)
    harness = None
    if job.harness.tasks:
        from orthros_jax.evaluation.harness_run import run_harness

        harness = run_harness(loaded, job.harness, out_dir, model_path=model_dir)
    if job.suite is not None:
        results = evaluate(loaded.cfg, loaded.params, job.suite, loaded.tokenizer_file)
    else:
        results = {"model": loaded.cfg.to_dict()}
    if harness is not None:
        results["harness"] = harness | {"spec": dataclasses.asdict(job.harness)}
    results["model_dir"] = os.path.abspath(model_dir)
    results["seconds"] = time.perf_counter() - t0
    write_results(results, out_dir, title=loaded.cfg.architecture)
    return results
