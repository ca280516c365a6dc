"""PT and SFT losses: masked mean next-token cross-entropy of the output stream, in float32.

PT batch:  tokens/positions/segment_ids/targets/loss_mask [B, T]; the output stream runs at
           every position and logits[b, t] predicts targets[b, t] (the next token of the same
           document; loss_mask is 0 where that token is in another document or padding).
SFT batch: tokens/positions/segment_ids [B, T]; output_positions/targets/loss_mask [B, T_out];
           output copies exist only at the answer-predicting positions.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax

from orthros_jax.model import OrthrosLM, Params

Batch = Mapping[str, jax.Array]


def masked_cross_entropy(
    logits: jax.Array, targets: jax.Array, loss_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Sum of token cross-entropies where loss_mask > 0, and the sum of the mask.

    logits [B, L, V] (any float dtype, upcast to float32), targets [B, L] int, loss_mask [B, L].
    Returns (loss_sum, weight) float32 scalars; the mean is loss_sum / max(weight, 1).
    """
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    mask = loss_mask.astype(jnp.float32)
    return jnp.sum(ce * mask), jnp.sum(mask)


def model_logits(model: OrthrosLM, params: Params, batch: Batch) -> jax.Array:
    """Float32 logits of the output stream: [B, T, V] (PT) or [B, T_out, V] (SFT, when the
    batch has "output_positions")."""
    batch = {k: jnp.asarray(v) for k, v in batch.items()}  # numpy batches work outside jit too
    return model.apply(
        {"params": params},
        batch["tokens"],
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        output_positions=batch.get("output_positions"),
    )


def loss_sums(model: OrthrosLM, params: Params, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """(loss_sum, weight) of a PT or SFT batch (the batch's keys say which)."""
    logits = model_logits(model, params, batch)
    return masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])


def mean_loss(
    model: OrthrosLM, params: Params, batch: Batch
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked mean loss (for jax.grad) and aux {"loss_sum", "weight"}. An all-masked batch has
    loss 0 and no gradient rather than 0/0."""
    loss_sum, weight = loss_sums(model, params, batch)
    return loss_sum / jnp.maximum(weight, 1.0), {"loss_sum": loss_sum, "weight": weight}


def pt_loss(model: OrthrosLM, params: Params, batch: Batch) -> jax.Array:
    """Mean PT loss: the output stream at every position predicts its next token."""
    if "output_positions" in batch:
        raise ValueError("pt_loss got an SFT batch (it has output_positions); use sft_loss")
    return mean_loss(model, params, batch)[0]


def sft_loss(model: OrthrosLM, params: Params, batch: Batch) -> jax.Array:
    """Mean SFT loss: only the output copies at batch["output_positions"] predict tokens."""
    if "output_positions" not in batch:
        raise ValueError("sft_loss needs batch['output_positions'] [B, T_out]")
    return mean_loss(model, params, batch)[0]
