"""Running a custom kernel (Pallas splash, cuDNN attention) per shard of the mesh in context.

A custom call cannot be partitioned by GSPMD the way XLA's own ops are (Pallas cannot at all;
cuDNN's partitioner needs q, k and v sharded alike), so under a mesh an attention kernel runs
inside jax.shard_map: rows over the batch axes whose product divides B (the trailing axes
dropped first, as parallel/mesh.shard_spec does), heads over "tensor" when both the query and the
kv head counts divide by it, every other free axis replicated. The mesh is
jax.sharding.get_abstract_mesh() (parallel/sharding.traced_under sets it for the train / eval steps
and launch/compile.py's programs); axes that are already manual (the sequence-parallel drivers'
shard_map) are left to their owner. No mesh, or one device: the kernel is called as is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from orthros_jax.axes import BATCH, HEADS, RULES


def _as_tuple(r: Any) -> tuple[str, ...]:
    return (r,) if isinstance(r, str) else tuple(r or ())


def row_axes(free: Sequence[str], sizes: dict[str, int], bsz: int) -> list[str]:
    """The batch axes (RULES[BATCH], those free and of size > 1) that `bsz` rows split over:
    the trailing ones dropped until the product divides bsz."""
    rows = [a for a in _as_tuple(RULES[BATCH]) if a in free and sizes[a] > 1]
    while rows and bsz % math.prod(sizes[a] for a in rows):
        rows.pop()
    return rows


def shard_rows_and_heads(
    fn: Callable[..., jax.Array],
    args: Sequence[jax.Array],
    head_dims: Sequence[int | None],
    n_heads: int,
    kv_heads: int,
) -> jax.Array:
    """fn(*args) per shard. Every arg has rows on dim 0; head_dims[i] is arg i's heads dim
    (None: no heads, e.g. segment ids [B, L]). The output is laid out like args[0]."""
    mesh = jax.sharding.get_abstract_mesh()
    free = [] if mesh.empty else [a for a in mesh.axis_names if a not in mesh.manual_axes]
    sizes = dict(mesh.shape) if free else {}
    if not free or math.prod(sizes[a] for a in free) == 1:
        return fn(*args)
    rows = row_axes(free, sizes, args[0].shape[0])
    heads = [a for a in _as_tuple(RULES[HEADS]) if a in free and sizes[a] > 1][:1]
    if heads and (n_heads % sizes[heads[0]] or kv_heads % sizes[heads[0]]):
        heads = []
    row_spec = tuple(rows) if len(rows) > 1 else (rows[0] if rows else None)

    def spec(arr: jax.Array, head_dim: int | None) -> P:
        dims: list = [row_spec] + [None] * (arr.ndim - 1)
        if head_dim is not None and heads:
            dims[head_dim] = heads[0]
        return P(*dims)

    specs = tuple(spec(a, d) for a, d in zip(args, head_dims, strict=True))
    sharded = jax.shard_map(
        fn, mesh=mesh, axis_names=set(free), in_specs=specs, out_specs=specs[0], check_vma=False
    )
    return sharded(*args)
