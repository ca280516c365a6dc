"""PT and SFT losses: masked mean next-token cross-entropy of the output stream, in float32.

PT batch:  tokens/positions/segment_ids/targets/loss_mask [B, T]; the output stream runs at
           every position and logits[b, t] predicts targets[b, t] (the next token of the same
           document; loss_mask is 0 where that token is in another document or padding).
SFT batch: tokens/positions/segment_ids [B, T]; output_positions/targets/loss_mask [B, T_out];
           output copies exist only at the answer-predicting positions.

Draft distillation (train.distill_draft_window > 0, configs/draft_so.py): on a PT batch, the
KL from the output stream (the teacher, no gradient) to a self-speculative draft's output copies
(each reading only its last draft_window keys, with the draft scale-offsets), summed over the
loss_mask positions: draft_kl_sums.

The loss is taken either from the full float32 logits [B, L, V] or, per train.loss_chunk, in
chunks of C positions (chunked_cross_entropy): the final hidden states [B, L, D] are cut along
L, and each chunk's logits [B, C, V] are computed, reduced to their loss and recomputed in the
backward pass (jax.checkpoint under lax.scan), so memory is O(B * C * V) instead of O(B * L * V).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax

from orthros_jax.config import ModelConfig
from orthros_jax.kernels import moe as kmoe
from orthros_jax.layers import primitives as nnl
from orthros_jax.model import OrthrosLM, Params, final_hidden, head_matrix

Batch = Mapping[str, jax.Array]
Stats = dict[str, jax.Array]
AUTO = -1  # train.loss_chunk: AUTO_CHUNK positions when the vocabulary is large, else full
AUTO_CHUNK = 1024
AUTO_MIN_VOCAB = 32000


def chunk_size(loss_chunk: int, vocab_size: int, length: int) -> int:
    """Positions per cross-entropy chunk for train.loss_chunk (AUTO, 0 = full logits, N > 0)
    at this vocabulary and output length; 0 means the full logits (also when one chunk would
    hold every position)."""
    if loss_chunk == AUTO:
        loss_chunk = AUTO_CHUNK if vocab_size >= AUTO_MIN_VOCAB else 0
    return 0 if loss_chunk >= length else loss_chunk


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


def chunked_cross_entropy(
    h_BLD: jax.Array, head_DV: jax.Array, targets: jax.Array, loss_mask: jax.Array, chunk: int
) -> tuple[jax.Array, jax.Array]:
    """masked_cross_entropy(lm_logits(h_BLD, head_DV), targets, loss_mask) without the [B, L, V]
    logits: a lax.scan over chunks of `chunk` positions (L padded to a multiple with masked
    positions), each chunk's logits [B, C, V] in float32 recomputed in the backward pass.

    h_BLD: final hidden states (after the final norm), head_DV: the LM head [D, V] (cast to
    h's dtype inside each chunk, so its gradient accumulates in the head's own dtype)."""
    if chunk < 1:
        raise ValueError(f"chunked_cross_entropy needs chunk >= 1, got {chunk}")
    b, length, d = h_BLD.shape
    n = -(-length // chunk)
    pad = n * chunk - length
    mask = loss_mask.astype(jnp.float32)
    if pad:
        h_BLD = jnp.pad(h_BLD, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
        mask = jnp.pad(mask, ((0, 0), (0, pad)))

    def chunks(a: jax.Array) -> jax.Array:  # [B, n * C, ...] -> [n, B, C, ...]
        return jnp.swapaxes(a.reshape(b, n, chunk, *a.shape[2:]), 0, 1)

    @jax.checkpoint
    def chunk_loss(h_BCD: jax.Array, t_BC: jax.Array, m_BC: jax.Array) -> jax.Array:
        logits = nnl.lm_logits(h_BCD, head_DV)
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, t_BC) * m_BC)

    def body(total: jax.Array, xs: tuple[jax.Array, ...]) -> tuple[jax.Array, None]:
        return total + chunk_loss(*xs), None

    zero = jnp.zeros((), jnp.float32)
    loss_sum, _ = jax.lax.scan(body, zero, (chunks(h_BLD), chunks(targets), chunks(mask)))
    return loss_sum, jnp.sum(mask)


def _model_inputs(batch: Batch) -> tuple[jax.Array, dict[str, jax.Array | None]]:
    batch = {k: jnp.asarray(v) for k, v in batch.items()}  # numpy batches work outside jit too
    kwargs = {
        "positions": batch["positions"],
        "segment_ids": batch["segment_ids"],
        "output_positions": batch.get("output_positions"),  # present in SFT batches only
    }
    return batch["tokens"], kwargs


def model_logits(model: OrthrosLM, params: Params, batch: Batch) -> jax.Array:
    """Float32 logits of the output stream: [B, T, V] (PT) or [B, T_out, V] (SFT, when the
    batch has "output_positions")."""
    return logits_and_moe_stats(model, params, batch)[0]


def _apply(
    model: OrthrosLM,
    params: Params,
    batch: Batch,
    method: Any = None,
    draft_window: int | None = None,
) -> tuple[jax.Array, Stats | None]:
    """model.apply (method: None = __call__, or OrthrosLM.features; draft_window: a
    speculative draft's output copies) and, with MoE layers, the router statistics it sows
    (None without MoE)."""
    tokens, kwargs = _model_inputs(batch)
    call: dict[str, Any] = kwargs if method is None else {**kwargs, "method": method}
    if draft_window is not None:
        call["draft_window"] = draft_window
    if model.cfg.moe is None:
        return cast(jax.Array, model.apply({"params": params}, tokens, **call)), None
    y, state = model.apply({"params": params}, tokens, **call, mutable=["intermediates"])
    return y, state["intermediates"]["moe_stats"][0]


def logits_and_moe_stats(
    model: OrthrosLM, params: Params, batch: Batch
) -> tuple[jax.Array, Stats | None]:
    """model_logits and, with MoE layers, the router statistics summed over the layers and
    both streams' tokens (kernels/moe.router_stats; None without MoE)."""
    return _apply(model, params, batch)


def moe_aux_loss(cfg: ModelConfig, stats: Stats) -> tuple[jax.Array, Stats]:
    """What MoE adds to the loss: aux_loss_coef * transformers' load-balancing loss +
    z_loss_coef * the router z-loss, and the metrics {"moe_balance_loss", "moe_z_loss",
    "moe_load" [E] (each expert's share of the routed (token, choice) pairs)}."""
    assert cfg.moe is not None
    balance, z = kmoe.load_balancing_loss(stats), kmoe.z_loss(stats)
    total = cfg.moe.aux_loss_coef * balance + cfg.moe.z_loss_coef * z
    return total, {
        "moe_balance_loss": balance,
        "moe_z_loss": z,
        "moe_load": kmoe.expert_load(stats),
    }


def loss_sums(
    model: OrthrosLM, params: Params, batch: Batch, loss_chunk: int = AUTO
) -> tuple[jax.Array, jax.Array]:
    """(loss_sum, weight) of a PT or SFT batch (the batch's keys say which); loss_chunk is
    train.loss_chunk (see chunk_size)."""
    loss_sum, weight, _ = loss_sums_and_moe_stats(model, params, batch, loss_chunk)
    return loss_sum, weight


def loss_sums_and_moe_stats(
    model: OrthrosLM, params: Params, batch: Batch, loss_chunk: int = AUTO
) -> tuple[jax.Array, jax.Array, Stats | None]:
    """loss_sums and, with MoE layers, the forward's router statistics (None without MoE)."""
    cfg = model.cfg
    chunk = chunk_size(loss_chunk, cfg.vocab_size, batch["targets"].shape[-1])
    if not chunk:
        logits, stats = _apply(model, params, batch)
        return *masked_cross_entropy(logits, batch["targets"], batch["loss_mask"]), stats
    x, stats = _apply(model, params, batch, OrthrosLM.features)
    h = final_hidden(params, x, cfg)
    targets, mask = jnp.asarray(batch["targets"]), jnp.asarray(batch["loss_mask"])
    return *chunked_cross_entropy(h, head_matrix(params, cfg), targets, mask, chunk), stats


def draft_kl_sums(
    model: OrthrosLM, params: Params, batch: Batch, draft_window: int
) -> tuple[jax.Array, jax.Array]:
    """(kl_sum, weight): sum over the loss_mask positions of KL(p || q), p the output stream's
    next-token distribution (stop-gradient), q the draft's at draft_window (PT batches only:
    a windowed copy needs the keys aligned with it)."""
    if "output_positions" in batch:
        raise ValueError("draft distillation needs PT batches (data.kind='pt'), got an SFT batch")
    teacher = jax.lax.stop_gradient(_apply(model, params, batch)[0])
    student = _apply(model, params, batch, draft_window=draft_window)[0]
    log_p = jax.nn.log_softmax(teacher, axis=-1)
    kl = jnp.sum(jnp.exp(log_p) * (log_p - jax.nn.log_softmax(student, axis=-1)), axis=-1)
    mask = jnp.asarray(batch["loss_mask"], jnp.float32)
    return jnp.sum(kl * mask), jnp.sum(mask)


def mean_loss(
    model: OrthrosLM, params: Params, batch: Batch, loss_chunk: int = AUTO
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked mean loss (for jax.grad) and aux {"loss_sum", "weight"}. An all-masked batch has
    loss 0 and no gradient rather than 0/0. With MoE layers the loss adds moe_aux_loss and aux
    carries its metrics ("loss_sum" stays the cross-entropy's)."""
    loss_sum, weight, stats = loss_sums_and_moe_stats(model, params, batch, loss_chunk)
    loss = loss_sum / jnp.maximum(weight, 1.0)
    aux = {"loss_sum": loss_sum, "weight": weight}
    if stats is not None:
        extra, metrics = moe_aux_loss(model.cfg, stats)
        loss, aux = loss + extra, aux | metrics
    return loss, aux


def pt_loss(model: OrthrosLM, params: Params, batch: Batch, loss_chunk: int = AUTO) -> jax.Array:
    """Mean PT loss: the output stream at every position predicts its next token."""
    if "output_positions" in batch:
        raise ValueError("pt_loss got an SFT batch (it has output_positions); use sft_loss")
    return mean_loss(model, params, batch, loss_chunk)[0]


def sft_loss(model: OrthrosLM, params: Params, batch: Batch, loss_chunk: int = AUTO) -> jax.Array:
    """Mean SFT loss: only the output copies at batch["output_positions"] predict tokens."""
    if "output_positions" not in batch:
        raise ValueError("sft_loss needs batch['output_positions'] [B, T_out]")
    return mean_loss(model, params, batch, loss_chunk)[0]
