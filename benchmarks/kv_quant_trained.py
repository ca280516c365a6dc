r"""A quantized KV cache on trained models: passkey accuracy and greedy agreement of int8 / fp8
against the full-precision cache (issue 28's "exact where claimed, within the tolerance where
not", on weights that were trained rather than random).

    python benchmarks/kv_quant_trained.py --models=runs/rl_reward_long/warm_orthros,\
runs/rl_reward_long/warm_transformer --out=runs/kv_quant_trained

Each --models entry is a model directory or training workdir (its newest checkpoint) of a
passkey model (configs/recall_passkey.py:<arm>, e.g. the warm starts benchmarks/rl_reward.py
writes). --prompts held-out passkey prompts (rl/tasks.py's EVAL_STREAM, the task of
configs/rl_passkey.py) are answered greedily with `generate` (--new tokens) on each cache dtype;
reported per model and dtype: the passkey accuracy (the completion starts with the key) and the
share of prompts whose completion equals the full-precision one token for token. Writes
--out/kv_quant_trained.json and .md.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.run_record import run_record  # noqa: E402
from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.data.tokenizers import ByteTokenizer  # noqa: E402
from orthros_jax.inference import generate  # noqa: E402
from orthros_jax.rl import tasks  # noqa: E402
from orthros_jax.rl.config import TaskConfig  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_list("models", None, "Passkey model directories or training workdirs.")
    flags.DEFINE_list("dtypes", ["int8", "fp8"], "Quantized cache dtypes to compare.")
    flags.DEFINE_integer("prompts", 256, "Held-out passkey prompts.")
    flags.DEFINE_integer("new", 2, "Greedy tokens per prompt (the key's digits).")
    flags.DEFINE_integer("batch", 64, "Prompts per generate call.")
    flags.DEFINE_string("out", None, "Output directory.")


def evaluate(directory: str, dtypes: list[str], n: int, new: int, batch: int) -> dict:
    """{dtype: {accuracy, agreement}} for one model; dtype 'full' is the unquantized cache."""
    model = checkpoint.load_model(directory)
    tok = ByteTokenizer()
    task = tasks.make_task(TaskConfig(name="passkey", context_len=128, digits=2), tok)
    prompts = [task.prompt(0, tasks.EVAL_STREAM, i) for i in range(n)]
    out: dict = {}
    for dtype in [None, *dtypes]:
        rows: list[list[int]] = []
        for i in range(0, n, batch):
            ids = [p.ids.tolist() for p in prompts[i : i + batch]]
            got = generate(model.params, ids, model.cfg, max_new_tokens=new, kv_cache_dtype=dtype)
            rows += [np.asarray(t)[:new].tolist() for t in got.tokens]
        texts = [tok.decode(r) for r in rows]
        acc = float(tasks.score(task.reward, texts, [p.answer for p in prompts]).mean())
        out[dtype or "full"] = {"accuracy": acc, "rows": rows}
    full = out["full"]["rows"]
    for v in out.values():
        v["agreement"] = float(np.mean([a == b for a, b in zip(v["rows"], full, strict=True)]))
        del v["rows"]
    return out


def main(argv: list[str]) -> None:
    del argv
    t0 = time.perf_counter()
    result = {
        "load_before": os.getloadavg()[0],
        "prompts": FLAGS.prompts,
        "models": {
            m: evaluate(m, FLAGS.dtypes, FLAGS.prompts, FLAGS.new, FLAGS.batch)
            for m in FLAGS.models
        },
        "load_after": os.getloadavg()[0],
    }
    result |= run_record(t0)
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, "kv_quant_trained.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [
        f"Passkey, {result['prompts']} held-out prompts; load {result['load_before']:.1f} -> "
        f"{result['load_after']:.1f}",
        "",
        "| model | cache | passkey accuracy | greedy agreement with full |",
        "|---|---|---|---|",
    ]
    for m, by in result["models"].items():
        for dtype, v in by.items():
            lines.append(f"| {m} | {dtype} | {v['accuracy']:.3f} | {v['agreement']:.3f} |")
    with open(os.path.join(FLAGS.out, "kv_quant_trained.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["models", "out"])
    app.run(main)
