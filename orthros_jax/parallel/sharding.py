"""Shardings of the model's parameters and of a TrainState, from the parameters' logical axes
and the rules of mesh.py; the jitted train / eval steps with explicit in/out shardings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from orthros_jax import model as model_lib
from orthros_jax.axes import EXPERT_AXIS
from orthros_jax.config import ModelConfig
from orthros_jax.layers.expert_parallel import check_experts_divide
from orthros_jax.parallel.mesh import batch_sharding, replicated, shard_spec


def param_shardings(cfg: ModelConfig, mesh: Mesh) -> Any:
    """NamedSharding for every parameter of OrthrosLM(cfg), from its logical axes. ValueError
    when a MoE model's experts do not divide over the mesh's expert axis."""
    if cfg.moe is not None:
        check_experts_divide(cfg.moe.n_experts, mesh.shape.get(EXPERT_AXIS, 1))
    abstract = jax.eval_shape(lambda r: model_lib.init_params(cfg, r), jax.random.PRNGKey(0))
    logical = model_lib.param_logical_axes(cfg)
    return jax.tree.map(
        lambda axes, a: NamedSharding(mesh, shard_spec(tuple(axes), a.shape, mesh)),
        logical,
        abstract,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def state_shardings(
    abstract_state: Any,
    params_sh: Any,
    tx: optax.GradientTransformation,
    mesh: Mesh,
    trained_sh: Any = None,
) -> Any:
    """Shardings of a TrainState: params by the rules, optimizer moments like their params
    (found with optax.tree_map_params), scalars (step, counts, rng) replicated. trained_sh:
    params_sh with None at the frozen parameters when only a subset trains (the optimizer
    state's tree; training/trainable.py)."""
    opt_sh = optax.tree_map_params(
        tx,
        lambda _, sh: sh,
        abstract_state.opt_state,
        params_sh if trained_sh is None else trained_sh,
        transform_non_params=lambda _: replicated(mesh),
    )
    return abstract_state.replace(
        step=replicated(mesh), params=params_sh, opt_state=opt_sh, rng=replicated(mesh)
    )


def traced_under(fn: Any, mesh: Mesh) -> Any:
    """fn traced with `mesh` as the abstract mesh in context, so a kernel that must run inside
    shard_map (attention_impl="splash" / "cudnn") finds it with get_abstract_mesh()."""

    def under_mesh(*args: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return under_mesh


def jit_train_step(
    train_step: Any, state_sh: Any, mesh: Mesh, batch_keys: Mapping[str, int]
) -> Any:
    """The train step as one jax.jit: explicit in/out shardings, the state donated.
    batch_keys: name -> ndim of each batch array."""
    batch_sh = {k: batch_sharding(mesh, nd) for k, nd in batch_keys.items()}
    return jax.jit(
        traced_under(train_step, mesh),
        in_shardings=(state_sh, batch_sh),
        out_shardings=(state_sh, replicated(mesh)),
        donate_argnums=(0,),
    )


def jit_eval_step(eval_step: Any, params_sh: Any, mesh: Mesh, batch_keys: Mapping[str, int]) -> Any:
    """The eval step as one jax.jit: params and the batch in, replicated metrics out."""
    batch_sh = {k: batch_sharding(mesh, nd) for k, nd in batch_keys.items()}
    return jax.jit(
        traced_under(eval_step, mesh),
        in_shardings=(params_sh, batch_sh),
        out_shardings=replicated(mesh),
    )
