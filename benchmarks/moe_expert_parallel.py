r"""Expert parallelism's collectives, paired vs independent routing: the collective bytes per
device of an Orthros-MoE PT step (forward + backward) and decode step compiled for 8
simulated CPU devices with the experts split over the mesh's "expert" axis
(layers/expert_parallel.py), read from the optimized HLO with loop trip counts
(benchmarks/hlo_loops.py), beside the same programs on a mesh without the expert axis
(data-parallel rows, every expert on every device) and the analytic all-gather bytes.

    python benchmarks/moe_expert_parallel.py --out=runs/moe_ep

The model is benchmarks/moe_routing.py's bench MoE (d_model 256, 4 MoE layers of 16 experts,
top-2) at random init. Compiled only: XLA:CPU's simulated devices share one host, so their
times say nothing of an interconnect. Writes --out/moe_expert_parallel.json and .md.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from absl import app, flags

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import load_config_file
from orthros_jax.config.moe import ROUTINGS
from orthros_jax.inference import drivers
from orthros_jax.inference.cache import cache_shardings, init_cache
from orthros_jax.model import OrthrosLM, init_params
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.hlo_loops import loop_weighted_collective_bytes  # noqa: E402
from benchmarks.moe_routing import moe_configs  # noqa: E402
from benchmarks.run_record import run_record  # noqa: E402

FLAGS = flags.FLAGS
DEVICES = 8
# name -> mesh sizes (data, fsdp, tensor, expert)
MESHES = {"expert=8": (1, 1, 1, 8), "data=2 x expert=4": (2, 1, 1, 4), "data=8": (8, 1, 1, 1)}


def define_flags() -> None:
    """Defined only when run: tests import several benchmarks into one process."""
    flags.DEFINE_string("out", None, "Output directory.")
    flags.DEFINE_string("config", os.path.join(ROOT, "configs", "bench.py"), "Bench config.")
    flags.DEFINE_integer("d_model", 256, "Model width.")
    flags.DEFINE_integer("layers", 4, "Layers (every one MoE).")
    flags.DEFINE_integer("experts", 16, "Experts per MoE layer.")
    flags.DEFINE_integer("top_k", 2, "Experts per token.")
    flags.DEFINE_integer("d_expert", 128, "Each expert's SwiGLU width.")
    flags.DEFINE_integer("batch", 8, "Rows of the PT and decode steps.")
    flags.DEFINE_integer("train_len", 256, "Tokens per row of the PT step.")
    flags.DEFINE_integer("context", 256, "Cache slots of the decode step.")
    flags.DEFINE_list("meshes", list(MESHES), f"Meshes to compile, of {list(MESHES)}.")
    flags.register_validator(
        "meshes",
        lambda names: bool(names) and set(names) <= set(MESHES),
        f"--meshes: one or more of {list(MESHES)}",
    )


def _mesh(sizes: tuple[int, ...]) -> jax.sharding.Mesh:
    from orthros_jax.training import MeshConfig

    return pmesh.make_mesh(MeshConfig(*sizes), jax.devices()[:DEVICES])


def _collectives(compiled: Any) -> dict[str, int]:
    return {k: v for k, v in loop_weighted_collective_bytes(compiled.as_text()).items() if v}


def train_collectives(cfg: ModelConfig, mesh: Any, batch: int, length: int) -> dict[str, int]:
    """Collective bytes per device of value_and_grad of the PT loss, params sharded by the
    rules, rows over the batch axes."""

    def loss(p: Any, tokens: jax.Array) -> jax.Array:
        logits = OrthrosLM(cfg).apply({"params": p}, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    p_sh = sharding.param_shardings(cfg, mesh)
    tokens = jax.ShapeDtypeStruct((batch, length + 1), jnp.int32)
    fn = jax.jit(
        sharding.traced_under(jax.value_and_grad(loss), mesh),
        in_shardings=(p_sh, pmesh.batch_sharding(mesh)),
    )
    return _collectives(fn.lower(params, tokens).compile())


def decode_collectives(cfg: ModelConfig, mesh: Any, batch: int, context: int) -> dict[str, int]:
    """Collective bytes per device of one decode step at a cache of `context` slots."""
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    cache = jax.eval_shape(lambda: init_cache(cfg, batch, context))
    rows = pmesh.batch_sharding(mesh, 1)
    fn = jax.jit(
        sharding.traced_under(functools.partial(drivers.decode, cfg=cfg), mesh),
        in_shardings=(
            sharding.param_shardings(cfg, mesh),
            cache_shardings(cfg, batch, context, mesh),
            rows,
            rows,
        ),
    )
    tok = jax.ShapeDtypeStruct((batch,), jnp.int32)
    active = jax.ShapeDtypeStruct((batch,), jnp.bool_)
    return _collectives(fn.lower(params, cache, tok, active).compile())


def gathered_bytes(cfg: ModelConfig, tokens: int, ep: int, rows_split: bool) -> int:
    """Analytic bytes one device receives per MoE layer in the forward's token all-gather:
    the other ep - 1 devices' tokens of both streams (activations, the model dtype)."""
    if ep == 1 or not rows_split:
        return 0
    return (ep - 1) * (tokens // ep) * cfg.d_model * jnp.dtype(cfg.dtype).itemsize


def measure(
    cfgs: dict[str, ModelConfig], batch: int, length: int, context: int, meshes: list[str]
) -> list[dict]:
    rows = []
    for mesh_name in meshes:
        mesh = _mesh(MESHES[mesh_name])
        for routing, cfg in cfgs.items():
            row = {"mesh": mesh_name, "routing": routing}
            row["train"] = train_collectives(cfg, mesh, batch, length)
            row["decode"] = decode_collectives(cfg, mesh, batch, context)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _mib(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v / 2**20:.2f}" for k, v in sorted(d.items())) or "none"


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"d_model {s['d_model']}, {s['layers']} MoE layers of {s['experts']} experts, top-"
        f"{s['top_k']}, d_expert {s['d_expert']}; PT step {s['batch']} x {s['train_len']}, decode"
        f" step batch {s['batch']} at {s['context']} slots; {DEVICES} simulated CPU devices, "
        f"{result['date']}. Collective MiB per device (loop-weighted, from the optimized HLO).",
        "",
        "| mesh | routing | PT step collectives (MiB) | decode step collectives (MiB) |",
        "|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['mesh']} | {r['routing']} | {_mib(r['train'])} | {_mib(r['decode'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    del argv
    t0 = time.perf_counter()
    if jax.device_count() < DEVICES:
        raise SystemExit(f"needs {DEVICES} devices (XLA_FLAGS is set when run as a script)")
    moe = dict(n_experts=FLAGS.experts, top_k=FLAGS.top_k, d_expert=FLAGS.d_expert)
    model = load_config_file(FLAGS.config).model
    cfgs = moe_configs(model, FLAGS.d_model, FLAGS.layers, 32, moe)
    settings = {k: getattr(FLAGS, k) for k in ("d_model", "layers", "experts", "top_k")}
    settings |= {k: getattr(FLAGS, k) for k in ("d_expert", "batch", "train_len", "context")}
    result: dict[str, Any] = dict(settings=settings, date=datetime.date.today().isoformat())
    result["rows"] = measure(cfgs, FLAGS.batch, FLAGS.train_len, FLAGS.context, FLAGS.meshes)
    cfg = cfgs[ROUTINGS[0]]
    both = 2 * FLAGS.batch * FLAGS.train_len  # base tokens and their copies, every row
    result["analytic_gather_bytes_per_layer"] = {
        name: gathered_bytes(cfg, both, sizes[3], FLAGS.batch % (sizes[0] * sizes[3]) == 0)
        for name, sizes in MESHES.items()
    }
    result |= run_record(t0)
    os.makedirs(FLAGS.out, exist_ok=True)
    with open(os.path.join(FLAGS.out, "moe_expert_parallel.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(FLAGS.out, "moe_expert_parallel.md"), "w") as f:
        f.write(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    flags_env = os.environ.get("XLA_FLAGS", "")
    if "device_count" not in flags_env:  # before the backend starts (jax imported is fine)
        os.environ["XLA_FLAGS"] = f"{flags_env} --xla_force_host_platform_device_count={DEVICES}"
    define_flags()
    flags.mark_flags_as_required(["out"])
    app.run(main)
