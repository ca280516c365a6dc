"""The paper's SFT-mode argument in RL form: GRPO's update and rollout time vs prompt length,
Orthros and the Transformer arm side by side in one run, and the engine as the sampler.

    python benchmarks/rl_scaling.py --prompt_lengths=1024,2048,4096,8192,16384 \
        --completion=64 --group=4 --repeats=3 --out=runs/rl_scaling

Per prompt length P, both arms (the same weights; Orthros with identity SO):
  update   one jitted GRPO update (rl/loss.py) on `group` rows of one (prompt, completion)
           pair each, output copies only on the completion: Orthros pays its window over the
           prompt, the Transformer full attention over it;
  rollout  the serving engine sampling `group` completions of `completion` tokens for one
           prompt (rl/rollout.py: chunked prefill, then decode), which is what an RL step runs;
  share    rollout / (rollout + update) per arm;
and `generate` (the library's batch decoder) on the same group of prompts, for the engine's
throughput against it. Timings interleave the arms round by round (benchmarks/common.py) so
the machine's drift hits both alike. Writes results.json and results.md under --out.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np
import optax
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import ORTHROS, TRANSFORMER, ratio, time_interleaved  # noqa: E402
from benchmarks.run_record import run_record  # noqa: E402
from orthros_jax.config import ModelConfig  # noqa: E402
from orthros_jax.inference import generate  # noqa: E402
from orthros_jax.inference.sampling import Sampler  # noqa: E402
from orthros_jax.model import OrthrosLM, init_params  # noqa: E402
from orthros_jax.rl.batch import Pair, pack_pairs  # noqa: E402
from orthros_jax.rl.config import GRPOConfig  # noqa: E402
from orthros_jax.rl.loss import make_update_step  # noqa: E402
from orthros_jax.rl.rollout import rollout  # noqa: E402
from orthros_jax.rl.tasks import Prompt  # noqa: E402
from orthros_jax.serving.engine import Engine  # noqa: E402
from orthros_jax.training.state import init_train_state  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_list("prompt_lengths", ["1024", "2048", "4096"], "Prompt lengths P.")
    flags.DEFINE_integer("completion", 64, "Completion tokens per sample.")
    flags.DEFINE_integer("group", 4, "Samples per prompt (rows of the update).")
    flags.DEFINE_integer("repeats", 3, "Interleaved timing rounds.")
    flags.DEFINE_integer("window", 128, "Orthros's window.")
    flags.DEFINE_string("out", "runs/rl_scaling", "Output directory.")


MODEL = dict(
    vocab_size=256,
    d_model=128,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=32,
    d_ff=384,
    attention_block_q=256,
    attention_block_k=256,
    prefill_chunk=2048,
)


def arms(window: int) -> dict[str, ModelConfig]:
    return {
        ORTHROS: ModelConfig(**MODEL, window=window, architecture=ORTHROS),
        TRANSFORMER: ModelConfig(**MODEL, window=window, architecture=TRANSFORMER),
    }


def _batch(rng: np.random.Generator, p: int, c: int, group: int) -> dict[str, np.ndarray]:
    prompt = rng.integers(0, 256, p).astype(np.int32)
    pairs = [
        Pair(prompt, rng.integers(0, 256, c).astype(np.int32), -np.ones(c, np.float32), float(a))
        for a in rng.normal(size=group)
    ]
    return pack_pairs(pairs, group, p + c, c)


def measure(p: int) -> dict:
    c, group = FLAGS.completion, FLAGS.group
    rng = np.random.default_rng(p)
    cfgs = arms(FLAGS.window)
    params = init_params(cfgs[ORTHROS], jax.random.PRNGKey(0))
    shared = {k: v for k, v in params["layers"].items() if not k.startswith("so_")}
    params_of = {ORTHROS: params, TRANSFORMER: {**params, "layers": shared}}
    batch = _batch(rng, p, c, group)
    tx = optax.adamw(1e-4)
    prompt = Prompt(batch["tokens"][0, :p].copy(), "")
    fns, engines = {}, {}
    for name, cfg in cfgs.items():
        state = init_train_state(cfg, tx, jax.random.PRNGKey(0), params=params_of[name])
        update = jax.jit(make_update_step(OrthrosLM(cfg), GRPOConfig(), tx, 1.0))
        fns[f"{name}/update"] = lambda u=update, s=state: u(s, s.params, batch)[1]["loss"]
        chunk = min(cfg.prefill_chunk, p)
        eng = Engine(
            params_of[name],
            cfg,
            max_batch=group,
            max_len=p + c,
            chunk_budget=chunk,
            prefill_lengths=(chunk,),
            prefill_batches=(group,),
        )
        eng.warmup()
        engines[name] = eng
        fns[f"{name}/rollout"] = lambda e=eng: (
            rollout(
                e, [prompt], group_size=group, max_new_tokens=c, temperature=1.0, seed=0, step=0
            ).completion_tokens
        )
        fns[f"{name}/generate"] = lambda cfg=cfg, pr=params_of[name]: (
            generate(
                pr,
                [prompt.ids] * group,
                cfg,
                max_new_tokens=c,
                sampler=Sampler(temperature=1.0),
                rng=jax.random.PRNGKey(0),
            ).tokens
        )
    t = time_interleaved(fns, FLAGS.repeats)
    row: dict = {"prompt_len": p, "completion": c, "group": group, "times": t}
    for name in cfgs:
        up, ro = t[f"{name}/update"]["median_s"], t[f"{name}/rollout"]["median_s"]
        row[name] = {
            "update_s": up,
            "rollout_s": ro,
            "rollout_share": ro / (ro + up),
            "engine_vs_generate": ratio(t[f"{name}/generate"], t[f"{name}/rollout"]),
        }
    row["update_speedup"] = ratio(t["transformer/update"], t["orthros/update"])
    row["rollout_speedup"] = ratio(t["transformer/rollout"], t["orthros/rollout"])
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| P | update s (T / O) | update speedup | rollout s (T / O) | rollout speedup | "
        "rollout share (T / O) | engine / generate tok/s (T / O) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t, o = r[TRANSFORMER], r[ORTHROS]
        lines.append(
            f"| {r['prompt_len']} | {t['update_s']:.3f} / {o['update_s']:.3f} | "
            f"{r['update_speedup']:.2f} | {t['rollout_s']:.3f} / {o['rollout_s']:.3f} | "
            f"{r['rollout_speedup']:.2f} | {t['rollout_share']:.2f} / {o['rollout_share']:.2f} | "
            f"{t['engine_vs_generate']:.2f} / {o['engine_vs_generate']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    del argv
    t0 = time.perf_counter()
    rows = []
    for p in (int(x) for x in FLAGS.prompt_lengths):
        rows.append(measure(p))
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
        json.dump({"rows": rows, "load": os.getloadavg(), **run_record(t0)}, f, indent=1)
    with open(os.path.join(FLAGS.out, "results.md"), "w") as f:
        f.write(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    define_flags()
    app.run(main)
