"""Pure train and eval steps (the loop jits them with shardings; see sharding.jit_train_step)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from orthros_jax.config import ModelConfig
from orthros_jax.layers import lora
from orthros_jax.model import OrthrosLM, Params
from orthros_jax.training import losses
from orthros_jax.training.config import OptimizerConfig
from orthros_jax.training.optimizer import accumulated_grads, make_schedule, update_count
from orthros_jax.training.state import TrainState
from orthros_jax.training.trainable import ALL, Trainable

Metrics = dict[str, jax.Array]
TrainStep = Callable[[TrainState, losses.Batch], tuple[TrainState, Metrics]]
EvalStep = Callable[[Params, losses.Batch], Metrics]


def make_train_step(
    model_cfg: ModelConfig,
    opt_cfg: OptimizerConfig,
    tx: optax.GradientTransformation,
    total_steps: int,
    loss_chunk: int = losses.AUTO,
    trainable: Trainable | None = None,
    draft_window: int = 0,
) -> TrainStep:
    """state, batch -> new state, metrics. One micro-batch per call (PT or SFT batch);
    loss_chunk: train.loss_chunk (losses.chunk_size).

    Metrics (float32 scalars): loss (masked mean of this micro-batch), weight (loss tokens),
    grad_norm (pre-clip global norm of the gradient the optimizer steps with: the running
    accumulation mean), param_norm (after the update), lr (of the update this micro-batch
    belongs to); with MoE layers also moe_balance_loss, moe_z_loss and moe_load [E]
    (losses.moe_aux_loss; the loss includes their weighted sum). A non-finite
    loss/grad_norm/param_norm is the loop's signal to stop. trainable: the subset that trains
    (training/trainable.py; None: every parameter); grad_norm is over that subset.
    draft_window > 0: the loss is the draft distillation's mean KL (losses.draft_kl_sums).
    """
    model = OrthrosLM(model_cfg)
    schedule = make_schedule(opt_cfg, total_steps)
    subset = trainable or Trainable(model_cfg, ALL)

    def train_step(state: TrainState, batch: losses.Batch) -> tuple[TrainState, Metrics]:
        key = jax.random.fold_in(state.rng, state.step)

        def loss_of(p: Params) -> tuple[jax.Array, Metrics]:
            p = lora.rank_dropout(p, model_cfg, key)  # the adapters' dropout (model.lora)
            if draft_window:
                kl_sum, weight = losses.draft_kl_sums(model, p, batch, draft_window)
                return kl_sum / jnp.maximum(weight, 1.0), {"loss_sum": kl_sum, "weight": weight}
            return losses.mean_loss(model, p, batch, loss_chunk)

        (loss, aux), grads = subset.value_and_grad(loss_of, state.params)
        grad_norm = optax.tree.norm(accumulated_grads(grads, state.opt_state, opt_cfg))
        params, opt_state = subset.update(tx, grads, state.opt_state, state.params)
        metrics = {
            "loss": loss,
            "weight": aux["weight"],
            "grad_norm": grad_norm,
            "param_norm": optax.tree.norm(params),
            "lr": jnp.asarray(schedule(update_count(state.step, opt_cfg)), jnp.float32),
        }
        metrics |= {k: v for k, v in aux.items() if k.startswith("moe_")}  # MoE layers only
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    return train_step


def make_eval_step(
    model_cfg: ModelConfig, loss_chunk: int = losses.AUTO, draft_window: int = 0
) -> EvalStep:
    """params, batch -> {"loss_sum", "weight"} (sum over batches, then divide); draft_window
    > 0: of the draft distillation's KL, as make_train_step."""
    model = OrthrosLM(model_cfg)

    def eval_step(params: Params, batch: losses.Batch) -> Metrics:
        if draft_window:
            loss_sum, weight = losses.draft_kl_sums(model, params, batch, draft_window)
        else:
            loss_sum, weight = losses.loss_sums(model, params, batch, loss_chunk)
        return {"loss_sum": loss_sum, "weight": weight}

    return eval_step
