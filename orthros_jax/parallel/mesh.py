"""The mesh, and shardings by the logical-axis rules (axes.RULES, the one table).

One table, RULES, maps the logical axis names that parameters carry (each kind's ParamDecl) to
axes of the mesh ("data", "fsdp", "tensor", "expert"; "sequence" in an inference mesh,
`sequence_mesh`):
  * batch dims are split over data x fsdp x expert (every device gets distinct examples);
  * parameters are split over fsdp along their embed dim (ZeRO-3 style: all-gathered per use)
    and over tensor along heads / kv heads / mlp / vocab (Megatron-style tensor parallelism);
  * a MoE layer's experts are split over expert (expert parallelism, layers/expert_parallel);
  * a KV cache's slots (logical "length") are split over sequence (sequence-parallel prefill
    and decode, inference/sequence_parallel.py); a mesh without that axis keeps them whole;
  * the stacked layer axis and head_dim are never split.
A dim whose size is not divisible by its mesh axes is replicated instead (e.g. 2 kv heads on
tensor=4), so any model runs on any mesh; `shard_spec` is the single place that decides.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from orthros_jax.axes import BATCH, RULES, SEQUENCE_AXIS, MeshAxes

# "expert" last: an expert group's all-gather / reduce-scatter runs between neighbouring
# devices (on a GPU host, within NVLink).
MESH_AXES = ("data", "fsdp", "tensor", "expert")


def initialize_distributed(dist_cfg: Any) -> None:
    """jax.distributed.initialize from a DistributedConfig (no-op unless initialize=True).
    Must run before anything touches the devices."""
    if not dist_cfg.initialize:
        return
    kwargs = {}
    if dist_cfg.coordinator_address:
        kwargs["coordinator_address"] = dist_cfg.coordinator_address
    if dist_cfg.num_processes > 0:
        kwargs["num_processes"] = dist_cfg.num_processes
    if dist_cfg.process_id >= 0:
        kwargs["process_id"] = dist_cfg.process_id
    jax.distributed.initialize(**kwargs)
    logging.info("jax.distributed: process %d of %d", jax.process_index(), jax.process_count())


def _named(sizes: Sequence[int]) -> dict[str, int]:
    return dict(zip(MESH_AXES, sizes, strict=True))


def mesh_shape(mesh_cfg: Any, num_devices: int) -> tuple[int, ...]:
    """(data, fsdp, tensor, expert) sizes with a single -1 filled in; the product must be
    num_devices."""
    sizes = [getattr(mesh_cfg, a) for a in MESH_AXES]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes {_named(sizes)}: at most one -1, others >= 1")
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if num_devices % known:
            raise ValueError(f"mesh {_named(sizes)} does not divide {num_devices} devices")
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f"mesh {_named(sizes)} has {math.prod(sizes)} devices, but {num_devices} are available"
        )
    return tuple(sizes)


def make_mesh(mesh_cfg: Any, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A Mesh over MESH_AXES from a MeshConfig (all devices by default)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_cfg, len(devices))
    # Auto axes: the compiler propagates shardings from the jit in/out shardings (GSPMD);
    # jax.make_mesh would default to Explicit axes, which the model's gathers do not annotate.
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    if len(devices) == len(jax.devices()):
        return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=auto)
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=auto)


def sequence_mesh(
    sequence: int, data: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A ("data", "sequence") mesh for sequence-parallel inference: cache rows over data, cache
    slots over sequence (init_cache(..., mesh=)). devices: all by default, data * sequence of
    them, in order (sequence neighbours are consecutive devices)."""
    devices = list(jax.devices() if devices is None else devices)
    for name, size in (("sequence", sequence), ("data", data)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"sequence_mesh: {name} must be a positive int, got {size!r}")
    if data * sequence != len(devices):
        raise ValueError(
            f"sequence_mesh: data={data} x sequence={sequence} = {data * sequence} devices, but "
            f"{len(devices)} are given"
        )
    return Mesh(np.asarray(devices).reshape(data, sequence), ("data", SEQUENCE_AXIS))


def shard_spec(
    logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Mapping = RULES
) -> PartitionSpec:
    """PartitionSpec for an array with these logical axis names, by RULES. A mesh axis is used
    at most once per array; dims not divisible by their mesh axes, or mapped to axes the mesh
    does not have, stay replicated."""
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for name, size in zip(logical, shape, strict=True):
        axes = rules.get(name) if name is not None else None
        if axes is None:
            spec.append(None)
            continue
        axes_t = (axes,) if isinstance(axes, str) else tuple(axes)
        axes_t = tuple(a for a in axes_t if a not in used and mesh.shape.get(a, 1) > 1)
        if not axes_t or size % math.prod(mesh.shape[a] for a in axes_t):
            spec.append(None)
            continue
        used.update(axes_t)
        spec.append(axes_t[0] if len(axes_t) == 1 else axes_t)
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """[B, ...] arrays: batch over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(RULES[BATCH], *([None] * (ndim - 1))))


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes that batch rows split over: RULES[BATCH]'s axes of size > 1 in `mesh`."""
    axes = RULES[BATCH]
    axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
    return tuple(a for a in axes if mesh.shape.get(a, 1) > 1)


def check_batch_divisible(
    batch: int, mesh: Mesh, what: str = "global batch size", whole_over: Sequence[str] = ()
) -> None:
    """ValueError (before any compile) unless `batch` rows split evenly over the mesh's batch
    axes (but those of `whole_over`, over which rows may also stay whole)."""
    sizes = {a: mesh.shape[a] for a in batch_axes(mesh) if a not in whole_over}
    n = math.prod(sizes.values())
    if batch % n:
        raise ValueError(
            f"{what} {batch} is not divisible by the mesh's batch axes {sizes} = {n}; use a "
            f"multiple of {n} (or another mesh)"
        )


def shard_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows [B_local, ...] -> global arrays [B_local * processes, ...] sharded by
    batch_sharding (jax.make_array_from_process_local_data; works on one host too)."""
    return {
        k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)), np.asarray(v))
        for k, v in batch.items()
    }


def put(x: Any, sharding: NamedSharding) -> jax.Array:
    """A host array (the same on every process) as a global array with this sharding."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def put_tree(tree: Any, shardings: Any) -> Any:
    """Host numpy pytree (same values on every process) -> global arrays with these shardings."""
    return jax.tree.map(put, tree, shardings)
