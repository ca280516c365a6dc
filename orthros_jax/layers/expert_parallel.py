"""The experts of a MoE layer under the mesh in context: expert parallelism.

With no mesh (or one device) the experts run as one call (kernels/moe.experts). Under a mesh
the layer runs in jax.shard_map over every free axis, each device sorting its own rows' tokens
(left to GSPMD, the sort over all tokens of a row-split batch would gather them). On a mesh
with an "expert" axis (axes.EXPERT_AXIS) of size ep > 1, every device holds E / ep experts
(the parameters' "expert" logical axis, axes.RULES), dropless, with Megatron's "allgather"
token dispatch:
  * rows over the batch axes (layers/kernel_mesh.row_axes: data x fsdp x expert where the
    batch divides); an expert group's rows are all-gathered over "expert" (every device of the
    group sees the group's tokens and their routing), each device runs its own experts on the
    (token, choice) pairs routed to them (kernels/moe's `first`: the others add nothing), and
    the partial outputs are reduce-scattered back to the rows' owners (psum_scatter). When
    the batch does not split over "expert" (decode at batch 1), the tokens are already on
    every device and the partials are summed (psum);
  * an expert's intermediate dim over "tensor" (RULES[MLP]) when it divides, the down
    projection's partial sums added over "tensor";
  * the other weights' dims (the fsdp split of embed) gathered per use, as GSPMD does.
The collective bytes do not depend on the routing (every token of a group is gathered once,
whichever experts it chose): paired and independent copies cost the same here.

Shapes: B rows, L tokens per row (both streams), D d_model, K top-k, E experts, I d_expert.
"""

from __future__ import annotations

import math

import jax
from jax.sharding import PartitionSpec as P

from orthros_jax.axes import EXPERT_AXIS, MLP, RULES
from orthros_jax.kernels import moe as kmoe
from orthros_jax.layers.kernel_mesh import row_axes


def expert_axis_size(mesh: jax.sharding.AbstractMesh) -> int:
    """The size of the free "expert" axis of `mesh` (1: none, or already manual)."""
    if mesh.empty or EXPERT_AXIS not in mesh.axis_names or EXPERT_AXIS in mesh.manual_axes:
        return 1
    return int(mesh.shape[EXPERT_AXIS])


def check_experts_divide(n_experts: int, ep: int) -> None:
    """ValueError unless the experts split evenly over an expert axis of size ep."""
    if ep > 1 and n_experts % ep:
        raise ValueError(
            f"moe.n_experts={n_experts} does not divide over the mesh's expert axis ({ep} "
            f"devices); use a multiple of {ep} experts or another mesh.expert"
        )


def _flat_experts(
    impl: str,
    x_BLD: jax.Array,
    w: tuple[jax.Array, jax.Array, jax.Array],
    gates_BLK: jax.Array,
    experts_BLK: jax.Array,
    first: int | jax.Array = 0,
) -> jax.Array:
    b, length, _ = x_BLD.shape
    flat = lambda a: a.reshape(b * length, -1)
    y = kmoe.experts(impl, flat(x_BLD), *w, flat(gates_BLK), flat(experts_BLK), first=first)
    return y.reshape(b, length, -1)


def run_experts(
    impl: str,
    x_BLD: jax.Array,
    w_gate_EDI: jax.Array,
    w_up_EDI: jax.Array,
    w_down_EID: jax.Array,
    gates_BLK: jax.Array,
    experts_BLK: jax.Array,
) -> jax.Array:
    """sum_k gates * SwiGLU_expert(x) of every token [B, L, D], over the mesh in context
    (expert-parallel when it has an "expert" axis; see the module docstring)."""
    w = (w_gate_EDI, w_up_EDI, w_down_EID)
    mesh = jax.sharding.get_abstract_mesh()
    free = [] if mesh.empty else [a for a in mesh.axis_names if a not in mesh.manual_axes]
    sizes = {a: int(mesh.shape[a]) for a in free}
    if math.prod(sizes.values()) == 1:
        return _flat_experts(impl, x_BLD, w, gates_BLK, experts_BLK)
    ep = expert_axis_size(mesh)
    check_experts_divide(w_gate_EDI.shape[0], ep)
    rows = row_axes(free, sizes, x_BLD.shape[0])
    gather = ep > 1 and EXPERT_AXIS in rows
    tp = RULES[MLP]
    tp = tp if isinstance(tp, str) and sizes.get(tp, 1) > 1 else None
    if tp is not None and w_gate_EDI.shape[-1] % sizes[tp]:
        tp = None
    row = P(tuple(rows) if len(rows) > 1 else (rows[0] if rows else None))
    ex = EXPERT_AXIS if ep > 1 else None
    w_in = P(ex, None, tp)  # [E, D, I]: experts over "expert", I over "tensor"
    w_out = P(ex, tp, None)  # [E, I, D]

    def local(
        x: jax.Array,
        w_gate: jax.Array,
        w_up: jax.Array,
        w_down: jax.Array,
        gates: jax.Array,
        experts: jax.Array,
    ) -> jax.Array:
        if gather:
            x, gates, experts = (
                jax.lax.all_gather(a, EXPERT_AXIS, axis=0, tiled=True) for a in (x, gates, experts)
            )
        first = jax.lax.axis_index(EXPERT_AXIS) * w_gate.shape[0] if ep > 1 else 0
        y = _flat_experts(impl, x, (w_gate, w_up, w_down), gates, experts, first)
        if tp is not None:
            y = jax.lax.psum(y, tp)
        if gather:
            return jax.lax.psum_scatter(y, EXPERT_AXIS, scatter_dimension=0, tiled=True)
        return jax.lax.psum(y, EXPERT_AXIS) if ep > 1 else y

    sharded = jax.shard_map(
        local,
        mesh=mesh,
        axis_names=set(free),
        in_specs=(row, w_in, w_in, w_out, row, row),
        out_specs=row,
        check_vma=False,
    )
    return sharded(x_BLD, *w, gates_BLK, experts_BLK)
