"""Losses (PT, SFT), optimizer (decay mask, schedule), gradient accumulation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from training_helpers import pt_batch, tiny_model

from orthros_jax import data as data_lib
from orthros_jax.model import OrthrosLM, init_params
from orthros_jax.training import (
    OptimizerConfig,
    init_train_state,
    losses,
    make_optimizer,
    make_schedule,
    make_train_step,
    weight_decay_mask,
)

CFG = tiny_model()
MODEL = OrthrosLM(CFG)


@jax.jit
def _forward(params, batch):
    """(logits, loss) of a PT or SFT batch: one compile per batch layout (op-by-op is slow)."""
    loss = (losses.sft_loss if "output_positions" in batch else losses.pt_loss)(
        MODEL, params, batch
    )
    return losses.model_logits(MODEL, params, batch), loss


def logits_of(params, batch):
    return _forward(params, batch)[0]


def pt_loss(params, batch):
    return _forward(params, batch)[1]


sft_loss = pt_loss  # the batch's keys pick the loss


@pytest.fixture(scope="module")
def params():
    return jax.jit(init_params, static_argnums=0)(CFG, jax.random.PRNGKey(0))


def _log_softmax_np(logits):
    logits = np.asarray(logits, np.float64)
    m = logits.max(-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


@pytest.mark.slow
def test_pt_loss_is_masked_mean_of_next_token_nll(params):
    batch = pt_batch(0)
    logits = logits_of(params, batch)
    assert logits.dtype == jnp.float32 and logits.shape == (8, 32, 256)
    nll = -np.take_along_axis(_log_softmax_np(logits), batch["targets"][..., None], -1)[..., 0]
    want = (nll * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
    np.testing.assert_allclose(float(pt_loss(params, batch)), want, atol=1e-5)
    # A target across a document boundary (loss_mask 0) contributes nothing.
    moved = dict(batch, targets=np.where(batch["loss_mask"] > 0, batch["targets"], 7))
    np.testing.assert_allclose(
        float(pt_loss(params, moved)),
        float(pt_loss(params, batch)),
        atol=1e-6,
    )


@pytest.mark.slow
def test_packed_documents_do_not_see_each_other(params):
    """The second document of every packed row gives the same logits when it is alone at the
    start of a row (the rest padding): nothing attends across the boundary."""
    packed = pt_batch(0)
    alone = {k: np.zeros_like(v) for k, v in packed.items()}
    spans = []
    for r in range(packed["tokens"].shape[0]):
        idx = np.nonzero(packed["segment_ids"][r] == 2)[0]
        n = len(idx)
        for k in ("tokens", "targets", "loss_mask", "positions"):
            alone[k][r, :n] = packed[k][r, idx]
        alone["segment_ids"][r, :n] = 1  # the rest stays segment 0 (padding)
        spans.append((idx, n))
    got, want = np.asarray(logits_of(params, packed)), np.asarray(logits_of(params, alone))
    for r, (idx, n) in enumerate(spans):
        np.testing.assert_allclose(got[r, idx], want[r, :n], atol=1e-5, rtol=0)


def test_all_masked_batch_has_zero_loss_not_nan(params):
    batch = dict(pt_batch(0), loss_mask=np.zeros((8, 32), np.float32))
    assert float(pt_loss(params, batch)) == 0.0


@pytest.fixture(scope="module")
def sft_batch():
    cfg = data_lib.DataConfig(
        kind="sft", seq_len=64, out_len=16, batch_size=4, validation_fraction=0.05
    )
    return data_lib.make_eval_batches(cfg, 1, process_index=0, process_count=1)[0]


@pytest.mark.slow
def test_sft_loss_matches_pt_on_the_same_positions(params, sft_batch):
    """The SFT loss (output copies only at answer positions) equals the PT loss (output stream
    everywhere) restricted to those positions, with the same model outputs there."""
    b = sft_batch
    idx, mask = b["output_positions"], b["loss_mask"]
    assert mask.sum() > 0 and (mask < 1).any()  # real answers, some padding slots
    rows = np.arange(idx.shape[0])[:, None]
    pt_targets = np.zeros_like(b["tokens"])
    pt_mask = np.zeros(b["tokens"].shape, np.float32)
    r, j = np.nonzero(mask > 0)  # real answer slots (padding slots may repeat an index)
    pt_targets[r, idx[r, j]] = b["targets"][r, j]
    pt_mask[r, idx[r, j]] = mask[r, j]
    pt = {k: b[k] for k in ("tokens", "positions", "segment_ids")}
    pt |= {"targets": pt_targets, "loss_mask": pt_mask}
    sft_logits = logits_of(params, b)
    pt_logits = logits_of(params, pt)
    assert sft_logits.shape == (4, 16, 256)
    valid = mask > 0
    np.testing.assert_allclose(
        np.asarray(sft_logits)[valid], np.asarray(pt_logits)[rows, idx][valid], atol=1e-5
    )
    np.testing.assert_allclose(
        float(sft_loss(params, b)),
        float(pt_loss(params, pt)),
        atol=1e-5,
    )


@pytest.mark.slow
def test_sft_loss_counts_only_answer_tokens(params, sft_batch):
    b = sft_batch
    # Answer targets are the next tokens of the same example (the last one, the answer's
    # terminator, is not an input token, so compare where the next input is in the segment).
    rows = np.arange(b["tokens"].shape[0])[:, None]
    at = b["output_positions"]
    nxt = np.minimum(at + 1, b["tokens"].shape[1] - 1)
    valid = b["loss_mask"] > 0
    inside = valid & (nxt > at) & (b["segment_ids"][rows, nxt] == b["segment_ids"][rows, at])
    assert inside.sum() > valid.sum() // 2
    np.testing.assert_array_equal(b["targets"][inside], b["tokens"][rows, nxt][inside])
    # Changing the targets of masked (non-answer) slots leaves the loss unchanged.
    junk = dict(b, targets=np.where(valid, b["targets"], 3))
    np.testing.assert_allclose(
        float(sft_loss(params, junk)),
        float(sft_loss(params, b)),
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="output_positions"):
        losses.sft_loss(MODEL, params, {k: v for k, v in b.items() if k != "output_positions"})


def test_weight_decay_mask_excludes_norms_so_and_embeddings(params):
    mask = weight_decay_mask(CFG)(params)
    assert mask["lm_head"] and not mask["embedding"] and not mask["final_norm"]
    layers = mask["layers"]
    for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
        assert layers[name], name
    for name in ("attn_norm", "mlp_norm", "so_base_scale", "so_out_offset"):
        assert not layers[name], name


def test_schedule_warms_up_then_decays_to_min_ratio():
    sched = make_schedule(OptimizerConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1), 100)
    np.testing.assert_allclose(float(sched(0)), 1e-4, rtol=1e-6)  # the first update moves
    np.testing.assert_allclose(float(sched(4)), 5e-4, rtol=1e-6)
    np.testing.assert_allclose(float(sched(9)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(sched(99)), 1e-4, rtol=1e-5)  # the last update
    assert float(sched(50)) < float(sched(20))


@pytest.mark.slow
def test_grad_accumulation_equals_one_big_batch():
    """2 micro-batches with MultiSteps == the concatenated batch in one step (equal loss weights
    per half, so the mean of means is the global mean)."""
    big = [pt_batch(i, batch=8) for i in range(2)]
    halves = [{k: v[s] for k, v in b.items()} for b in big for s in (slice(0, 4), slice(4, 8))]
    results = []
    for accum, batches in ((1, big), (2, halves)):
        # Small lr: Adam turns float-rounding noise in near-zero gradients into ~lr updates.
        opt = OptimizerConfig(lr=1e-3, warmup_steps=0, grad_accum_steps=accum)
        one_layer = tiny_model(n_layers=1)  # compiles faster; depth is not the point here
        tx = make_optimizer(opt, 2, one_layer)
        state = jax.jit(init_train_state, static_argnums=(0, 1))(
            one_layer, tx, jax.random.PRNGKey(1)
        )
        step = jax.jit(make_train_step(one_layer, opt, tx, 2))
        norms = []
        for b in batches:
            state, m = step(state, b)
            norms.append(float(m["grad_norm"]))
        results.append((state.params, norms[accum - 1 :: accum]))
    (p1, n1), (p2, n2) = results
    np.testing.assert_allclose(n2, n1, rtol=1e-5)  # grad_norm is that of the mean gradient
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
