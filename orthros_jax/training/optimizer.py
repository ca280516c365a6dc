"""AdamW + linear warmup + cosine decay + global-norm clipping (+ gradient accumulation), optax.

Weight decay applies to the projection matrices (wq, wk, wv, wo, w_gate, w_up, w_down) and an
untied lm_head. Excluded: every norm gain, the scale-offset vectors (they are per-head affine
gains/biases initialised to 1/0 — decaying them would pull the scale towards 0, not towards the
identity) and the input embedding (decay on a lookup table only shrinks the rows of tokens seen
in a batch; with tied embeddings the table is also the head and stays undecayed).

Gradient accumulation uses optax.MultiSteps: each call of the train step takes one micro-batch,
and the wrapped optimizer updates every `grad_accum_steps` calls with the mean gradient.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from orthros_jax.training.config import OptimizerConfig

DECAYED = frozenset(
    {"wq", "wk", "wv", "wo", "wq_gate", "w_gate", "w_up", "w_down", "lm_head"}
    | {"gdn_wq", "gdn_wk", "gdn_wv", "gdn_wz", "gdn_wb", "gdn_wa", "gdn_out"}
    | {f"{p}_{w}" for p in ("gla", "retention") for w in ("wq", "wk", "wv", "wg", "out")}
    | {"gla_wgk1", "gla_wgk2"}
)


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


def weight_decay_mask(params: Any) -> Any:
    """True for the parameters that get weight decay (see the module docstring)."""

    def decayed(path, _leaf) -> bool:
        name = getattr(path[-1], "key", None)
        return name in DECAYED

    return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(cfg: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    """The full update rule; `total_steps` counts optimizer updates (not micro-batches)."""
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
            mask=weight_decay_mask,
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
