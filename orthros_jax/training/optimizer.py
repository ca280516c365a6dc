"""AdamW + linear warmup + cosine decay + global-norm clipping (+ gradient accumulation), optax.

Weight decay applies to the parameters whose declaration says so (kind.ParamDecl.decay:
model.param_decls, from each layer kind's declarations, the shared block's and the model's own):
the projection matrices and an untied lm_head. Excluded: every norm gain, the scale-offset
vectors (per-head affine gains/biases initialised to 1/0: decaying them would pull the scale
towards 0, not towards the identity), conv taps, biases and decay parameters, and the input
embedding (decay on a lookup table only shrinks the rows of tokens seen in a batch).

Gradient accumulation uses optax.MultiSteps: each call of the train step takes one micro-batch,
and the wrapped optimizer updates every `grad_accum_steps` calls with the mean gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from orthros_jax.config import ModelConfig
from orthros_jax.model import param_decls
from orthros_jax.training.config import OptimizerConfig


def make_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """lr(update u), u = 0 .. total_steps - 1: linear warmup lr * (u + 1) / warmup_steps (the
    first update already moves the weights), then cosine to lr * min_lr_ratio at the last
    update (held there afterwards)."""
    warmup = min(cfg.warmup_steps, max(total_steps, 0))
    base = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.lr,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=cfg.lr * cfg.min_lr_ratio,
    )
    return lambda count: base(count + 1)


def weight_decay_mask(model: ModelConfig) -> Callable[[Any], Any]:
    """params -> the tree of bools, True for the parameters that get weight decay (their
    declaration's `decay`); a parameter without a declaration is a ValueError naming it."""
    decls = param_decls(model)

    def mask(params: Any) -> Any:
        def decayed(path: Any, _leaf: Any) -> bool:
            d: Any = decls
            for key in path:
                name = getattr(key, "key", key)
                if not isinstance(d, dict) or name not in d:
                    where = "/".join(str(getattr(k, "key", k)) for k in path)
                    raise ValueError(f"parameter {where} has no declaration (kind.ParamDecl)")
                d = d[name]
            return bool(d.decay)

        return jax.tree_util.tree_map_with_path(decayed, params)

    return mask


def make_optimizer(
    cfg: OptimizerConfig, total_steps: int, model: ModelConfig
) -> optax.GradientTransformation:
    """The full update rule for `model`'s parameters; `total_steps` counts optimizer updates
    (not micro-batches)."""
    parts = []
    if cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip))
    parts.append(
        optax.adamw(
            learning_rate=make_schedule(cfg, total_steps),
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            mask=weight_decay_mask(model),
        )
    )
    tx = optax.chain(*parts)
    if cfg.grad_accum_steps > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=cfg.grad_accum_steps).gradient_transformation()
    return tx


def accumulated_grads(grads: Any, opt_state: Any, cfg: OptimizerConfig) -> Any:
    """The gradient the optimizer will step with once this micro-batch is added: the running
    mean over the current accumulation window (equals `grads` without accumulation)."""
    if cfg.grad_accum_steps == 1:
        return grads
    n = opt_state.mini_step.astype(jnp.float32)
    return jax.tree.map(lambda g, acc: acc + (g - acc) / (n + 1), grads, opt_state.acc_grads)


def update_count(step: jax.Array, cfg: OptimizerConfig) -> jax.Array:
    """Optimizer updates completed after `step` micro-batches."""
    return step // cfg.grad_accum_steps
