"""lm-evaluation-harness tasks on a loaded model: `run_harness` -> results JSON + a summary.

    from orthros_jax.checkpoint import load_model
    summary = run_harness(load_model("runs/x"), HarnessSpec(tasks=("arc_easy",)), "out/")

Writes out_dir/harness_results.json (lm-eval's results dict: per-task metrics with stderr,
configs, versions, n-shot) and, with log_samples, out_dir/harness_samples.jsonl. Tasks are
loaded one by one first, so a dataset that cannot be reached fails with the task's name and
what to download, before any model work. Needs the `eval` extra (lm-eval, accelerate).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # checkpoint pulls in orbax; this module is imported by configs/eval.py
    from orthros_jax.checkpoint import LoadedModel

RESULTS_JSON = "harness_results.json"
SAMPLES_JSONL = "harness_samples.jsonl"


def split_names(values: Any) -> tuple[str, ...]:
    """('lm,passkey',) or 'lm,passkey' -> ('lm', 'passkey'): ml_collections keeps a comma
    list given on the command line for a tuple of strings as one string."""
    items = (values,) if isinstance(values, str) else tuple(values)
    return tuple(t.strip() for item in items for t in str(item).split(",") if t.strip())


@dataclasses.dataclass(frozen=True)
class HarnessSpec:
    """Which lm-eval tasks and how. num_fewshot: -1 = each task's default. limit: examples
    per task (0 = all; < 1 = a fraction). max_length: context + continuation tokens per
    forward. include_path: extra task directories (YAML), ':'-separated; include_defaults:
    also lm-eval's own tasks (indexing them takes ~10 s)."""

    tasks: tuple[str, ...] = ()
    num_fewshot: int = -1
    limit: float = 0.0
    batch_size: int = 16
    max_length: int = 2048
    max_gen_toks: int = 256
    include_path: str = ""
    include_defaults: bool = True
    log_samples: bool = False
    bootstrap_iters: int = 100_000
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", split_names(self.tasks))
        for name in ("batch_size", "max_length", "max_gen_toks"):
            if getattr(self, name) < 1:
                raise ValueError(f"harness.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_fewshot < -1:
            raise ValueError(
                f"harness.num_fewshot must be >= 0 (or -1: task default), got {self.num_fewshot}"
            )
        if self.limit < 0:
            raise ValueError(f"harness.limit must be >= 0 (0 = all examples), got {self.limit}")
        if self.bootstrap_iters < 0:
            raise ValueError(f"harness.bootstrap_iters must be >= 0, got {self.bootstrap_iters}")


def _task_manager(spec: HarnessSpec) -> Any:
    from lm_eval.tasks import TaskManager

    paths = [p for p in spec.include_path.split(":") if p]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise ValueError(f"harness.include_path: {missing} do not exist")
    return TaskManager(include_path=paths or None, include_defaults=spec.include_defaults)


def _dataset_of(manager: Any, name: str) -> str:
    entry = manager.task_index.get(name)
    cfg = getattr(entry, "cfg", None) or {}
    if not cfg.get("dataset_path"):
        return "its datasets"
    sub = f", name={cfg['dataset_name']!r}" if cfg.get("dataset_name") else ""
    return f"the dataset {cfg['dataset_path']!r}{sub}"


def _dataset_hint() -> str:
    from orthros_jax.evaluation.harness import DATASET_HINT  # needs lm_eval, as this module

    return DATASET_HINT


def load_tasks(names: tuple[str, ...], manager: Any) -> list[Any]:
    """The lm-eval Task/Group objects of `names` (datasets loaded), one name at a time so a
    failure names its task. ValueError for an unknown name or a dataset that cannot be read."""
    import datasets

    objs: list[Any] = []
    for name in names:
        if name not in manager.all_tasks and not os.path.isfile(name):
            raise ValueError(
                f"harness task {name!r} is unknown to lm-eval (see `lm-eval ls tasks`; local "
                "YAML tasks need harness.include_path)"
            )
        try:
            loaded = manager.load([name])
        except (OSError, datasets.exceptions.DatasetsError) as e:
            what = _dataset_of(manager, name)
            raise ValueError(
                f"harness task {name!r}: {what} cannot be loaded here ({type(e).__name__}: {e}). "
                + _dataset_hint()
            ) from e
        if name in loaded.get("groups", {}):
            objs.append(loaded["groups"][name])
        elif name in loaded["tasks"]:
            objs.append(loaded["tasks"][name])
        else:  # a tag: its tasks
            objs.extend(loaded["tasks"].values())
    return objs


def summarize(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} of lm-eval's results (filters kept in the name when not
    "none"; stderr and bookkeeping dropped)."""
    out: dict[str, dict[str, float]] = {}
    for task, metrics in results.get("results", {}).items():
        row = {}
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")
            if "_stderr" in metric or not isinstance(value, int | float):
                continue
            row[metric if filt in ("", "none") else f"{metric},{filt}"] = float(value)
        out[task] = row
    return out


def run_harness(
    loaded: LoadedModel,
    spec: HarnessSpec,
    out_dir: str,
    *,
    model_path: str | None = None,
    task_manager: Any = None,
) -> dict[str, Any]:
    """Runs spec.tasks on a loaded model with lm-eval, writes the results JSON (and samples)
    into out_dir and returns {"tasks": summarize(...), "seconds", "results_file"}."""
    if not spec.tasks:
        raise ValueError("harness.tasks is empty: name at least one lm-eval task")
    import lm_eval
    from lm_eval.utils import handle_non_serializable

    from orthros_jax.evaluation.harness import OrthrosHarnessLM

    manager = task_manager or _task_manager(spec)
    tasks = load_tasks(spec.tasks, manager)
    lm = OrthrosHarnessLM(
        loaded=loaded,
        batch_size=spec.batch_size,
        max_length=spec.max_length,
        max_gen_toks=spec.max_gen_toks,
        seed=spec.seed,
    )
    lm.model_path = model_path
    t0 = time.perf_counter()
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        num_fewshot=None if spec.num_fewshot < 0 else spec.num_fewshot,
        limit=spec.limit or None,
        log_samples=spec.log_samples,
        bootstrap_iters=spec.bootstrap_iters,
        task_manager=manager,
        random_seed=spec.seed,
    )
    seconds = time.perf_counter() - t0
    os.makedirs(out_dir, exist_ok=True)
    samples = results.pop("samples", None)
    path = os.path.join(out_dir, RESULTS_JSON)
    with open(path, "w") as f:
        json.dump(results, f, indent=2, default=handle_non_serializable, ensure_ascii=False)
    if samples:
        with open(os.path.join(out_dir, SAMPLES_JSONL), "w") as f:
            for task, rows in samples.items():
                for row in rows:
                    line = {"task": task, **row}
                    f.write(json.dumps(line, default=handle_non_serializable) + "\n")
    return {"tasks": summarize(results), "seconds": seconds, "results_file": RESULTS_JSON}
