"""Ahead-of-time compiles of a train, prefill or decode config for an accelerator target that
is not here: XLA's real TPU (libtpu) or GPU (jax-cuda12-plugin) compiler against abstract
devices (jax.experimental.topologies), on a CPU host. launch/compile.py is its CLI.

What is compiled is what would run: a train config builds training.loop's abstract state,
shardings and sharding.jit_train_step over the target's devices (launch/train.py's step); an
inference config (configs/prefill_8b.py, decode_8b.py: `model`, `inference`, `mesh`) builds the
jitted inference/drivers.py prefill / decode, or inference/sequence_parallel.py's when
mesh.sequence > 1. The report:
per-device argument / output / alias / temporary bytes and their peak (argument + output -
alias + temporary) against the chip's HBM; a program the compiler refuses for memory
(RESOURCE_EXHAUSTED) is reported as not fitting with the compiler's figures. FLOPs are the
analytic model's (orthros_jax/layers/flops.py: the arms' necessary FLOPs; cost_analysis counts
a scanned layer body once, and remat's recompute is not necessary work); collective bytes are
read from the optimized HLO with loop trip counts (hlo_loops.py). Roofline: step time >=
max(FLOPs / peak, (argument + output - alias bytes: every input read, every new output
written, once) / HBM bandwidth, collective bytes / interconnect bandwidth), and the
MFU bound is the FLOP term over that maximum.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import hlo_stats
from benchmarks.hlo_loops import loop_weighted_collective_bytes
from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import to_plain
from orthros_jax.inference import drivers as cached_forward
from orthros_jax.inference import sequence_parallel
from orthros_jax.inference.cache import cache_shardings, init_cache
from orthros_jax.layers import flops
from orthros_jax.model import init_params, num_params
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sequence as pseq
from orthros_jax.parallel import sharding
from orthros_jax.parallel.device_specs import DeviceSpec

TPU_TARGET = re.compile(r"^(v4|v5e|v5p|v6e|tpu7x):\d+x\d+(x\d+)?$")
GPU_TARGET = re.compile(r"^h100x(?P<n>[1-8])$")
GPU_TARGET_FILE = os.path.join(os.path.dirname(__file__), "targets", "h100_sxm.txtpb")
TARGETS_HELP = "v5e:2x2 | v5e:4x4 | v5p:2x2x1 | v5p:2x2x2 | v6e:2x2 | v4:2x2x1 | h100x1..h100x8"


def has_gpu_compiler() -> bool:
    """Whether jax-cuda12-plugin is installed. find_spec of a submodule raises when the parent
    namespace package (jax_plugins) is absent, as on a fresh machine, hence the two steps."""
    return (
        importlib.util.find_spec("jax_plugins") is not None
        and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    )


def target_devices(target: str) -> list[Any]:
    """The abstract devices of a target name; ValueError for an unknown name or a missing
    compiler (libtpu for TPU targets, jax-cuda12-plugin for h100xN)."""
    from jax.experimental import topologies

    if TPU_TARGET.match(target):
        if importlib.util.find_spec("libtpu") is None:
            raise ValueError(
                f"target {target!r} needs the TPU compiler: pip install -e '.[tpu]' (libtpu)"
            )
        return list(topologies.get_topology_desc(platform="tpu", topology_name=target).devices)
    m = GPU_TARGET.match(target)
    if m:
        if not has_gpu_compiler():
            raise ValueError(
                f"target {target!r} needs the GPU compiler: pip install --no-deps "
                f"jax-cuda12-plugin=={jax.__version__} jax-cuda12-pjrt=={jax.__version__}"
            )
        with open(GPU_TARGET_FILE) as f:
            topo = topologies.get_topology_desc(
                platform="cuda",
                topology_name="",
                target_config=f.read(),
                topology=f"1x1x{m['n']}",
            )
        return list(topo.devices)
    raise ValueError(f"unknown target {target!r}; allowed: {TARGETS_HELP}")


@dataclasses.dataclass
class Program:
    """A jitted function with abstract arguments, the mesh it is traced under, and what it
    is: kind (train/prefill/decode/...), analytic FLOPs per step (all devices; None: the
    compiled program's cost_analysis, right only when no layer loop is scanned), a summary."""

    fn: Any
    args: tuple
    mesh: Any
    kind: str
    flops: float | None
    summary: dict[str, Any]


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings
    )


def _model_summary(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "architecture": cfg.architecture,
        "params": num_params(cfg),
        "remat": cfg.remat,
        "attention_impl": cfg.attention_impl,
        "dtype": cfg.dtype,
        "window": cfg.window,
    }


def train_program(config: Any, devices: list[Any]) -> Program:
    """The train step launch/train.py would run, over `devices` (one micro-batch)."""
    from orthros_jax.training import TrainConfig
    from orthros_jax.training.optimizer import make_optimizer
    from orthros_jax.training.start import abstract_state, trainable_of
    from orthros_jax.training.steps import make_train_step

    plain = to_plain(config)
    # Only shapes are compiled: the tokenizer file (which DataConfig checks) is not read.
    plain["data"] = dict(plain["data"], tokenizer=None)
    cfg = TrainConfig.from_config(plain)
    mesh = pmesh.make_mesh(cfg.mesh, devices)
    tx = make_optimizer(cfg.optimizer, cfg.train.steps, cfg.model)
    state, _ = abstract_state(cfg, tx, mesh)
    data = cfg.data
    bsz, t = data.batch_size, data.seq_len
    pmesh.check_batch_divisible(bsz, mesh)
    shapes = {k: (bsz, t) for k in ("tokens", "positions", "segment_ids")}
    out_len = data.out_len if data.kind == "sft" else t
    shapes |= {k: (bsz, out_len) for k in ("targets", "loss_mask")}
    if data.kind == "sft":
        shapes["output_positions"] = (bsz, out_len)
    batch = {
        k: jax.ShapeDtypeStruct(s, jnp.int32, sharding=pmesh.batch_sharding(mesh, 2))
        for k, s in shapes.items()
    }
    step = make_train_step(
        cfg.model, cfg.optimizer, tx, cfg.train.steps, cfg.train.loss_chunk, trainable_of(cfg)
    )
    fn = sharding.jit_train_step(
        step, jax.tree.map(lambda a: a.sharding, state), mesh, dict.fromkeys(shapes, 2)
    )
    summary = _model_summary(cfg.model) | {
        "mode": f"train ({data.kind})",
        "batch": bsz,
        "seq_len": t,
        "grad_accum_steps": cfg.optimizer.grad_accum_steps,
        "tokens_per_update": bsz * t * cfg.optimizer.grad_accum_steps,
        "mesh": dict(mesh.shape),
    }
    step_flops = flops.train_step_flops(cfg.model, bsz, t, out_len)
    return Program(fn, (state, batch), mesh, "train", step_flops, summary)


@dataclasses.dataclass(frozen=True)
class InferenceConfig:
    """An inference config's `inference` section: what to compile. mode "speculative"
    (benchmarks/aot_spec.py) compiles the decode step, the draft step and a verify pass per k
    in spec_ks, and projects bytes per accepted token at the acceptance a of each k."""

    mode: str = "prefill"  # "prefill" (a prompt into an empty cache), "decode" (one step), ...
    batch_size: int = 1
    prompt_len: int = 2048  # prefill: tokens per prompt
    max_len: int = 2048  # cache slots per row (decode: the context)
    spec_ks: tuple[int, ...] = (4, 8)  # speculative: drafts per round
    acceptance: tuple[float, ...] = (4.33, 6.87)  # speculative: tokens per verify at each k
    draft_window: int = 0  # speculative: slots a draft's global query reads (0: model.window)
    # (the speculative fields are checked by aot_spec.speculative_programs)

    def __post_init__(self) -> None:
        if self.mode not in ("prefill", "decode", "speculative"):
            raise ValueError(f"inference.mode={self.mode!r}: 'prefill', 'decode' or 'speculative'")
        for name in ("batch_size", "prompt_len", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"inference.{name} must be >= 1, got {getattr(self, name)}")
        if self.mode == "prefill" and self.prompt_len > self.max_len:
            raise ValueError(
                f"inference.prompt_len={self.prompt_len} exceeds max_len={self.max_len}"
            )


@dataclasses.dataclass
class InferenceSetup:
    """An inference config resolved over the target's devices: the model, the `inference`
    section, the mesh, abstract params and cache (sharded), and a row vector's sharding."""

    cfg: ModelConfig
    inf: InferenceConfig
    mesh: Any
    params: Any
    cache: Any
    rows: NamedSharding
    sequence: bool  # the sequence-parallel drivers (mesh.sequence > 1)

    def vec(self, dtype: Any, *trailing: int) -> jax.ShapeDtypeStruct:
        """An abstract [B, *trailing] array with rows split as the cache's."""
        spec = P(*self.rows.spec, *([None] * len(trailing)))
        shape = (self.inf.batch_size, *trailing)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(self.mesh, spec))

    def summary(self) -> dict[str, Any]:
        return _model_summary(self.cfg) | {
            "mode": self.inf.mode,
            "batch": self.inf.batch_size,
            "max_len": self.inf.max_len,
            "mesh": dict(self.mesh.shape),
        }


def inference_setup(config: Any, devices: list[Any]) -> InferenceSetup:
    """The model, mesh and abstract arguments of an inference config over `devices` (its
    mesh's first devices): a sequence mesh when mesh.sequence > 1, else rows over data, heads
    over tensor, a MoE model's experts over expert."""
    from orthros_jax.config.cli import dataclass_from_dict

    plain = to_plain(config)
    cfg = ModelConfig.from_dict(plain["model"])
    inf = dataclass_from_dict(InferenceConfig, plain["inference"], "inference")
    m = {"data": 1, "sequence": 1, "tensor": 1, "expert": 1} | dict(plain.get("mesh", {}))
    unknown = sorted(set(m) - {"data", "sequence", "tensor", "expert"})
    if unknown:
        raise ValueError(
            f"unknown mesh key(s) {unknown} of an inference config: data, sequence, tensor, expert"
        )
    need = m["data"] * m["sequence"] * m["tensor"] * m["expert"]
    if need > len(devices) or len(devices) % need:
        raise ValueError(
            f"mesh {m} needs {need} devices; the target has {len(devices)} (a divisor of it: "
            "the first devices are used)"
        )
    devices = devices[:need]
    bsz, s = inf.batch_size, inf.max_len
    if m["sequence"] > 1:
        if m["tensor"] > 1 or m["expert"] > 1:
            raise ValueError("mesh.sequence > 1 cannot be combined with mesh.tensor / expert > 1")
        mesh = pmesh.sequence_mesh(m["sequence"], m["data"], devices)
        params_sh = jax.tree.map(lambda _: pmesh.replicated(mesh), _params_shape(cfg))
    else:
        from orthros_jax.training import MeshConfig

        mesh_cfg = MeshConfig(data=m["data"], fsdp=1, tensor=m["tensor"], expert=m["expert"])
        mesh = pmesh.make_mesh(mesh_cfg, devices)
        params_sh = sharding.param_shardings(cfg, mesh)
    pseq.check_mesh(cfg, bsz, s, mesh)
    params = _abstract(_params_shape(cfg), params_sh)
    cache = _abstract(
        jax.eval_shape(lambda: init_cache(cfg, bsz, s)), cache_shardings(cfg, bsz, s, mesh)
    )
    rows = NamedSharding(mesh, pmesh.shard_spec(("batch",), (bsz,), mesh))
    return InferenceSetup(cfg, inf, mesh, params, cache, rows, m["sequence"] > 1)


def inference_program(config: Any, devices: list[Any]) -> Program:
    """The jitted prefill / decode of an inference config over `devices`: the
    sequence-parallel drivers when mesh.sequence > 1, else inference.drivers' (rows over data,
    heads over tensor, a MoE model's experts over expert)."""
    st = inference_setup(config, devices)
    cfg, inf, mesh, seq = st.cfg, st.inf, st.mesh, st.sequence
    if inf.mode == "speculative":
        raise ValueError("inference.mode='speculative' is several programs (benchmarks/aot_spec)")
    bsz, s = inf.batch_size, inf.max_len
    summary = st.summary()
    if inf.mode == "prefill":
        t = s if seq else inf.prompt_len  # sequence parallel: prompts on the slot grid
        row_spec = st.rows.spec[0] if len(st.rows.spec) else None
        tok_sh = NamedSharding(mesh, P(row_spec, sequence_parallel.SEQ) if seq else P(row_spec))
        tokens = jax.ShapeDtypeStruct((bsz, t), jnp.int32, sharding=tok_sh)
        summary["prompt_len"] = inf.prompt_len
        if seq:
            fn = lambda p, c, tk, ln: sequence_parallel.prefill(p, c, tk, ln, cfg=cfg, mesh=mesh)
        else:
            fn = lambda p, c, tk, ln: cached_forward.prefill(p, c, tk, ln, cfg=cfg)
        args = (st.params, st.cache, tokens, st.vec(jnp.int32))
        work = bsz * flops.prefill_flops(cfg, inf.prompt_len)
    else:
        if seq:
            fn = lambda p, c, tk, a: sequence_parallel.decode(p, c, tk, a, cfg=cfg, mesh=mesh)
        else:
            fn = lambda p, c, tk, a: cached_forward.decode(p, c, tk, a, cfg=cfg)
        args = (st.params, st.cache, st.vec(jnp.int32), st.vec(jnp.bool_))
        work = bsz * flops.decode_flops(cfg, s)
    jitted = jax.jit(sharding.traced_under(fn, mesh), donate_argnums=(1,))
    return Program(jitted, args, mesh, inf.mode, work, summary)


def _params_shape(cfg: ModelConfig) -> Any:
    return jax.eval_shape(lambda r: init_params(cfg, r), jax.random.PRNGKey(0))


def program_of(config: Any, devices: list[Any]) -> Program:
    """A train config (it has `optimizer`) or an inference config (it has `inference`)."""
    keys = set(to_plain(config))
    if "inference" in keys:
        return inference_program(config, devices)
    if "optimizer" in keys:
        return train_program(config, devices)
    raise ValueError(
        f"the config has sections {sorted(keys)}: a train config (model, data, optimizer, "
        "train, mesh, ...) or an inference config (model, inference, mesh) is needed"
    )


_OOM = re.compile(
    r"(?P<what>[\w ]+?) \((?P<need>[\d.]+)(?P<unit>[KMGT])\) exceeds available HBM "
    r"\((?P<have>[\d.]+)(?P<unit2>[KMGT])\)"
)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def compile_program(program: Program, spec: DeviceSpec) -> dict[str, Any]:
    """Compiles and measures; the compile.json record (figures per device)."""
    n = program.mesh.size
    rec: dict[str, Any] = {"summary": program.summary, "kind": program.kind, "devices": n}
    rec["device"] = dataclasses.asdict(spec)
    if program.flops is not None:
        rec["flops_per_step"] = program.flops
        rec["flops_per_device"] = program.flops / n
    try:
        compiled = program.fn.lower(*program.args).compile()
    except Exception as e:  # noqa: BLE001 - the compiler's refusal for memory is a result
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text:
            raise
        m = _OOM.search(text)
        rec["fits"] = False
        rec["error"] = text.strip().splitlines()[0][:400]
        if m:
            rec["oom_need_bytes"] = float(m["need"]) * _UNITS[m["unit"]]
            rec["oom_available_bytes"] = float(m["have"]) * _UNITS[m["unit2"]]
            rec["oom_what"] = m["what"].split(" for ")[-1].strip()  # e.g. "HLO temporaries"
        return rec
    rec["cost_analysis"] = hlo_stats.cost_analysis(compiled)
    if program.flops is None:
        rec["flops_per_device"] = rec["cost_analysis"]["flops"]
        rec["flops_per_step"] = rec["flops_per_device"] * n
    mem = compiled.memory_analysis()
    b = {
        "argument": mem.argument_size_in_bytes,
        "output": mem.output_size_in_bytes,
        "alias": mem.alias_size_in_bytes,
        "temp": mem.temp_size_in_bytes,
    }
    b["peak"] = b["argument"] + b["output"] - b["alias"] + b["temp"]
    rec["bytes_per_device"] = b
    rec["fits"] = b["peak"] <= spec.hbm_bytes
    rec["headroom_bytes"] = spec.hbm_bytes - b["peak"]
    text = compiled.as_text()
    rec["hlo_text"] = text  # written beside compile.json (hlo.txt.gz), not into it
    return analyze(rec, text, spec)


def analyze(rec: dict[str, Any], text: str, spec: DeviceSpec) -> dict[str, Any]:
    """The figures read from the optimized HLO text into `rec` (which holds the memory stats):
    the custom kernels, loop-weighted collective bytes, the roofline terms and the MFU bound.
    Also re-runs on a saved hlo.txt.gz (refresh)."""
    b = rec["bytes_per_device"]
    # The custom kernels in the program (splash: tpu_custom_call; cuDNN: __cudnn$fmha...).
    rec["custom_calls"] = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    coll = loop_weighted_collective_bytes(text)
    rec["collective_bytes_per_device"] = coll
    t_flops = rec["flops_per_device"] / spec.peak_bf16_flops
    t_mem = (b["argument"] + b["output"] - b["alias"]) / spec.hbm_bandwidth
    t_comm = sum(coll.values()) / spec.interconnect_bandwidth
    step = max(t_flops, t_mem, t_comm)
    rec["roofline_s"] = {"compute": t_flops, "memory": t_mem, "collectives": t_comm, "step": step}
    rec["mfu_bound"] = t_flops / step if step > 0 else math.nan
    return rec


def refresh(out_dir: str) -> dict[str, Any]:
    """Re-reads out_dir/hlo.txt.gz into out_dir/compile.json (after a change to the HLO
    analysis; the compile itself is not redone)."""
    import gzip
    import json

    with open(os.path.join(out_dir, "compile.json")) as f:
        rec = json.load(f)
    with gzip.open(os.path.join(out_dir, "hlo.txt.gz"), "rt") as f:
        text = f.read()
    rec = analyze(rec, text, DeviceSpec(**rec["device"]))
    with open(os.path.join(out_dir, "compile.json"), "w") as f:
        json.dump(rec, f, indent=1)
    return rec
