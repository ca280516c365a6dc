"""TrainState: everything a run needs to continue exactly (besides the data iterator)."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import optax

from orthros_jax.config import ModelConfig
from orthros_jax.model import Params, init_params
from orthros_jax.training.trainable import Trainable


class TrainState(flax.struct.PyTreeNode):
    """step: micro-batches consumed (int32 scalar); params; opt_state (optax); rng: a raw
    uint32[2] PRNG key, the run's base key (per-step keys are fold_in(rng, step), so resuming
    reproduces them)."""

    step: jax.Array
    params: Params
    opt_state: optax.OptState
    rng: jax.Array


def init_train_state(
    cfg: ModelConfig,
    tx: optax.GradientTransformation,
    rng: jax.Array,
    params: Params | None = None,
    trainable: Trainable | None = None,
) -> TrainState:
    """A fresh state. With `params` given (init_from), only the optimizer state is created,
    for the `trainable` subset only (None: every parameter). Pure, so it can be
    jax.eval_shape'd and jitted with out_shardings."""
    init_rng, state_rng = jax.random.split(rng)
    if params is None:
        params = init_params(cfg, init_rng)
    opt_state = tx.init(params if trainable is None else trainable.split(params)[0])
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state, rng=state_rng
    )
