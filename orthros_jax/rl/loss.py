"""The GRPO / GSPO objective on an SFT-shaped batch (rl/batch.py), and its jitted update.

Per output copy (a completion token) with log-prob l = log softmax(logits / temperature) at its
target, the sampling log-prob l_old (from the engine) and the pair's advantage A:
  token ratio (GRPO):     r = exp(l - l_old)
  sequence ratio (GSPO):  r = exp(mean over the completion's tokens of (l - l_old))
  term = -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef * k3
with k3 = exp(l_ref - l) - (l_ref - l) - 1, the unbiased, non-negative estimate of
KL(pi || pi_ref) (Schulman's k3, as GRPO uses). LossNorm.TOKEN averages the terms over every
completion token of the batch; SEQUENCE averages each completion first, then the completions.

Shapes: R rows, T tokens, O output copies per row, V vocab, S = R * O + 1 sequence ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
import optax

from orthros_jax.layers import lora
from orthros_jax.model import OrthrosLM, Params
from orthros_jax.rl.config import GRPOConfig, LossNorm, Ratio
from orthros_jax.training.state import TrainState
from orthros_jax.training.trainable import ALL, Trainable

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


def target_logprobs(
    model: OrthrosLM, params: Params, batch: Batch, temperature: float
) -> jax.Array:
    """[R, O] float32 log-probs of each output copy's target under softmax(logits / T)."""
    logits_ROV = cast(
        jax.Array,
        model.apply(
            {"params": params},
            batch["tokens"],
            positions=batch["positions"],
            segment_ids=batch["segment_ids"],
            output_positions=batch["output_positions"],
        ),
    )
    logp_ROV = jax.nn.log_softmax(logits_ROV.astype(jnp.float32) / temperature, axis=-1)
    return jnp.take_along_axis(logp_ROV, batch["targets"][..., None], axis=-1)[..., 0]


def _per_sequence_mean(x_RO: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """(mean of x over each sequence's copies [S], copies per sequence [S])."""
    seq, mask = batch["sequence"].reshape(-1), batch["loss_mask"].reshape(-1)
    n = seq.shape[0] + 1
    total = jax.ops.segment_sum(x_RO.reshape(-1) * mask, seq, num_segments=n)
    count = jax.ops.segment_sum(mask, seq, num_segments=n)
    return total / jnp.maximum(count, 1.0), count


def grpo_loss(
    logp_RO: jax.Array, ref_RO: jax.Array | None, batch: Batch, g: GRPOConfig
) -> tuple[jax.Array, Metrics]:
    """The objective (a scalar to minimise) from the policy's log-probs and, with KL, the
    reference's; metrics: clip_fraction, kl, ratio (means over completion tokens)."""
    mask = batch["loss_mask"]
    delta = logp_RO - batch["old_logprobs"]
    if g.ratio is Ratio.SEQUENCE:
        seq_delta, _ = _per_sequence_mean(delta, batch)
        delta = seq_delta[batch["sequence"]]
    ratio = jnp.exp(delta)
    adv = batch["advantages"]
    clipped = jnp.clip(ratio, 1.0 - g.clip_low, 1.0 + g.clip_high)
    term = -jnp.minimum(ratio * adv, clipped * adv)
    kl = jnp.zeros_like(term)
    if ref_RO is not None:
        d = ref_RO - logp_RO
        kl = jnp.exp(d) - d - 1.0
        term = term + g.kl_coef * kl
    n_tok = jnp.maximum(mask.sum(), 1.0)
    if g.loss_norm is LossNorm.TOKEN:
        loss = jnp.sum(term * mask) / n_tok
    else:
        per_seq, count = _per_sequence_mean(term, batch)
        present = (count > 0).astype(jnp.float32)
        loss = jnp.sum(per_seq * present) / jnp.maximum(present.sum(), 1.0)
    was_clipped = ((ratio < 1.0 - g.clip_low) & (adv < 0)) | (
        (ratio > 1.0 + g.clip_high) & (adv > 0)
    )
    mean = lambda x: jnp.sum(x * mask) / n_tok
    return loss, {
        "clip_fraction": mean(was_clipped.astype(jnp.float32)),
        "kl": mean(kl),
        "ratio": mean(ratio),
        "logprob_gap": mean(jnp.abs(logp_RO - batch["old_logprobs"])),
    }


def make_update_step(
    model: OrthrosLM,
    g: GRPOConfig,
    tx: optax.GradientTransformation,
    temperature: float,
    trainable: Trainable | None = None,
) -> Any:
    """(state, ref_params, batch) -> (state, metrics): one optimizer update on a rollout
    batch of the `trainable` subset (None: every parameter). ref_params are read only when
    g.kl_coef > 0 (one forward, no gradient)."""
    subset = trainable or Trainable(model.cfg, ALL)

    def update(state: TrainState, ref_params: Params, batch: Batch) -> tuple[TrainState, Metrics]:
        ref = None
        if g.kl_coef > 0:
            ref = jax.lax.stop_gradient(target_logprobs(model, ref_params, batch, temperature))

        def objective(p: Params) -> tuple[jax.Array, Metrics]:
            return grpo_loss(target_logprobs(model, p, batch, temperature), ref, batch, g)

        key = jax.random.fold_in(state.rng, state.step)
        dropped = lambda p: objective(lora.rank_dropout(p, model.cfg, key))
        (loss, metrics), grads = subset.value_and_grad(dropped, state.params)
        params, opt_state = subset.update(tx, grads, state.opt_state, state.params)
        metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return update
