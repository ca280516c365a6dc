"""The chunked cross-entropy (train.loss_chunk): equal to the full-logits loss and gradients
for PT (packed segments, masked tokens) and SFT batches, tied and untied embeddings, and its
compiled program never holds the [B, T, V] logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from training_helpers import pt_batch, tiny_model

from orthros_jax import data as data_lib
from orthros_jax.layers import primitives as nnl
from orthros_jax.model import OrthrosLM, init_params
from orthros_jax.training import (
    LoopConfig,
    OptimizerConfig,
    init_train_state,
    losses,
    make_optimizer,
    make_train_step,
)


def _sft_batch() -> dict[str, np.ndarray]:
    cfg = data_lib.DataConfig(
        kind="sft", seq_len=64, out_len=16, batch_size=4, validation_fraction=0.05
    )
    return data_lib.make_eval_batches(cfg, 1, process_index=0, process_count=1)[0]


def _loss_and_grads(model, params, batch, loss_chunk):
    fn = jax.jit(
        jax.value_and_grad(lambda p: losses.mean_loss(model, p, batch, loss_chunk), has_aux=True)
    )
    (loss, aux), grads = fn(params)
    return float(loss), float(aux["weight"]), grads


@pytest.mark.slow  # 4 x 2 gradient compiles of the model
@pytest.mark.parametrize("kind,tied", [("pt", False), ("pt", True), ("sft", False), ("sft", True)])
def test_chunked_loss_and_gradients_equal_the_full_logits(kind, tied):
    cfg = tiny_model(tie_embeddings=tied, n_layers=1)
    model = OrthrosLM(cfg)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    batch = pt_batch(3, batch=4, seq=32) if kind == "pt" else _sft_batch()
    assert (batch["loss_mask"] == 0).any() and batch["loss_mask"].sum() > 0
    full_loss, full_w, full_g = _loss_and_grads(model, params, batch, 0)
    loss, w, grads = _loss_and_grads(model, params, batch, 5)  # 5: the last chunk is padded
    assert w == full_w
    np.testing.assert_allclose(loss, full_loss, rtol=1e-6, atol=1e-6)
    leaves = zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(full_g), strict=True)
    for (path, g), ref in leaves:
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(ref), rtol=1e-6, atol=1e-6, err_msg=str(path)
        )
    head_grad = full_g["embedding"] if tied else full_g["lm_head"]
    assert float(jnp.abs(head_grad).max()) > 1e-4  # the comparison is not of zeros


def test_chunked_cross_entropy_matches_a_float64_oracle():
    """Direct call, bf16 hidden states: the chunked sum equals log-softmax in float64 of the
    same bf16 products (the logits are computed in float32 from bf16 inputs)."""
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(2, 13, 16)), jnp.bfloat16)
    head = jnp.asarray(rng.normal(size=(16, 40)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 40, (2, 13)), jnp.int32)
    mask = jnp.asarray(rng.integers(0, 2, (2, 13)), jnp.float32)
    loss, weight = losses.chunked_cross_entropy(h, head, targets, mask, 4)
    logits = np.einsum(
        "bld,dv->blv",
        np.asarray(h.astype(jnp.float32), np.float64),
        np.asarray(head.astype(jnp.bfloat16).astype(jnp.float32), np.float64),
    )
    m = logits.max(-1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(loss), (nll * np.asarray(mask)).sum(), rtol=1e-5)
    assert float(weight) == float(mask.sum())


@pytest.mark.optimized  # about the compiled program
@pytest.mark.slow
def test_chunked_gradient_program_never_holds_the_logits():
    """The compiled gradient of the chunked loss keeps O(B * C * V) temporaries; the full one
    holds the [B, T, V] float32 logits (memory_analysis of XLA's CPU program)."""
    b, t, d, v, chunk = 2, 512, 16, 8192, 64
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(d, v)) * 0.1, jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    mask = jnp.ones((b, t), jnp.float32)

    def full(h, w):
        return losses.masked_cross_entropy(nnl.lm_logits(h, w), targets, mask)[0]

    def chunked(h, w):
        return losses.chunked_cross_entropy(h, w, targets, mask, chunk)[0]

    logits_bytes = b * t * v * 4
    temps = {}
    for name, fn in (("full", full), ("chunked", chunked)):
        compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(h, head).compile()
        temps[name] = compiled.memory_analysis().temp_size_in_bytes
    assert temps["full"] >= logits_bytes, temps
    chunk_bytes = b * chunk * v * 4  # 1/8 of the logits
    assert temps["chunked"] < 3 * chunk_bytes, temps  # a chunk's logits and their gradient
    (lf, gf), (lc, gc) = (jax.value_and_grad(f, argnums=(0, 1))(h, head) for f in (full, chunked))
    np.testing.assert_allclose(float(lc), float(lf), rtol=1e-6)
    for a, r in zip(gc, gf, strict=True):  # O(1) entries summed over 1024 rows: norm-relative
        a, r = np.asarray(a, np.float64), np.asarray(r, np.float64)
        assert np.linalg.norm(a - r) <= 1e-6 * np.linalg.norm(r), np.abs(a - r).max()


def test_chunk_size_rule_and_config_check():
    assert losses.chunk_size(-1, 128256, 32768) == losses.AUTO_CHUNK
    assert losses.chunk_size(-1, 32000, 2048) == losses.AUTO_CHUNK
    assert losses.chunk_size(-1, 256, 2048) == 0  # small vocab: the full logits
    assert losses.chunk_size(512, 256, 2048) == 512
    assert losses.chunk_size(4096, 128256, 2048) == 0  # one chunk would hold every position
    assert losses.chunk_size(0, 128256, 32768) == 0
    with pytest.raises(ValueError, match="train.loss_chunk"):
        LoopConfig(loss_chunk=-2)


@pytest.mark.slow  # two train-step compiles
def test_train_step_with_the_chunked_loss_takes_the_same_update():
    cfg = tiny_model(n_layers=1)
    opt = OptimizerConfig(lr=1e-2, warmup_steps=0)
    tx = make_optimizer(opt, 4, cfg)
    batch = pt_batch(5, batch=4, seq=32)
    out = {}
    for chunk in (0, 8):
        state = init_train_state(cfg, tx, jax.random.PRNGKey(0))
        step = jax.jit(make_train_step(cfg, opt, tx, 4, chunk))
        out[chunk] = step(state, batch)
    (s0, m0), (s8, m8) = out[0], out[8]
    np.testing.assert_allclose(float(m8["loss"]), float(m0["loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(m8["grad_norm"]), float(m0["grad_norm"]), rtol=1e-5)
    diff = optax.tree.norm(jax.tree.map(lambda a, c: a - c, s8.params, s0.params))
    assert float(diff) < 1e-6 * float(optax.tree.norm(s0.params))
