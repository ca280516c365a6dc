"""The trained draft's scale-offsets (ModelConfig.draft_scale_offset, docs/speculative.md): they
change only the speculative draft (decoding stays lossless), start as the output stream's SO,
train alone by distillation, leave exports, and bad settings are one-line ValueErrors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import randomize_so
from safetensors.numpy import load_file
from training_helpers import pt_batch, tiny_model

from orthros_jax.convert.export import export_hf
from orthros_jax.inference import Speculative, generate
from orthros_jax.layers.stack import drop_draft_so, fill_identity_so
from orthros_jax.model import OrthrosLM, init_params
from orthros_jax.training import OptimizerConfig, init_train_state, make_optimizer
from orthros_jax.training.config import LoopConfig, TrainConfig
from orthros_jax.training.losses import draft_kl_sums
from orthros_jax.training.steps import make_train_step
from orthros_jax.training.trainable import trainable_subset

DRAFT = r"/so_draft_(scale|offset)$"
PROMPTS = [list(np.random.RandomState(i).randint(0, 64, size=n)) for i, n in enumerate([5, 19])]


@pytest.fixture(scope="module")
def model():
    """A tiny Orthros with draft SO; every SO (the draft's too) randomised, so the draft's
    queries differ from the output stream's; a sharper LM head (logits of size 1) and sharper
    attention (at init q.k is near 0: the queries' SO would hardly matter)."""
    cfg = tiny_model(vocab_size=64, draft_scale_offset=True)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    params = randomize_so(params, 3, 0.5)
    layers = {
        **params["layers"],
        "wq": params["layers"]["wq"] * 8,
        "wk": params["layers"]["wk"] * 8,
    }
    return cfg, {**params, "lm_head": params["lm_head"] * 8, "layers": layers}


def test_draft_so_changes_only_the_draft(model):
    cfg, params = model
    no_draft, plain_cfg = drop_draft_so(params, cfg)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 64, (2, 24)))

    def run(c, p, draft_window=None):
        fn = jax.jit(OrthrosLM(c).apply, static_argnames="draft_window")
        return np.asarray(fn({"params": p}, tokens, draft_window=draft_window))

    # The model itself (the verify pass, plain decoding) does not read the draft SO ...
    np.testing.assert_allclose(run(cfg, params), run(plain_cfg, no_draft), atol=1e-6, rtol=0)
    # ... the draft does; filled from the output SO (a checkpoint without them) it is the plain
    # windowed draft exactly.
    ours, theirs = run(cfg, params, draft_window=4), run(plain_cfg, no_draft, draft_window=4)
    assert np.abs(ours - theirs).max() > 1e-2
    filled, added = fill_identity_so(no_draft, cfg)
    assert added == ["layers/so_draft_scale", "layers/so_draft_offset"]
    np.testing.assert_array_equal(run(cfg, filled, draft_window=4), theirs)
    # Greedy speculation with a non-identity draft SO is still plain greedy, token for token.
    kw = dict(max_new_tokens=12, cache_size=40)
    plain = generate(params, PROMPTS, cfg, **kw)
    spec = generate(params, PROMPTS, cfg, speculative=Speculative(3, 4), **kw)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    assert 0 < spec.speculation.accepted.sum() < spec.speculation.drafted.sum()


@pytest.mark.slow
def test_distillation_lowers_the_kl_and_moves_only_the_draft_so(model):
    cfg, params = model
    # A draft SO far from the output stream's: a gap the SO alone can close.
    layers = dict(params["layers"])
    for i, name in enumerate(("so_draft_scale", "so_draft_offset")):
        noise = jax.random.normal(jax.random.PRNGKey(10 + i), layers[name].shape)
        layers[name] = layers[name.replace("draft", "out")] + noise
    params = {**params, "layers": layers}
    opt = OptimizerConfig(lr=1e-1, warmup_steps=0)
    tx = make_optimizer(opt, 4, cfg)
    subset = trainable_subset(cfg, DRAFT)
    assert subset.paths() == ["layers/so_draft_offset", "layers/so_draft_scale"]
    state = init_train_state(cfg, tx, jax.random.PRNGKey(0), params, subset)
    step = jax.jit(make_train_step(cfg, opt, tx, 4, 0, subset, draft_window=4))
    batch = pt_batch(0, batch=2, seq=24)
    batch = {**batch, "tokens": batch["tokens"] % 64, "targets": batch["targets"] % 64}
    new, losses = state, []
    for _ in range(4):
        new, metrics = step(new, batch)
        losses.append(float(metrics["loss"]))
    kl = jax.jit(lambda p: jnp.divide(*draft_kl_sums(OrthrosLM(cfg), p, batch, 4)))
    before, after = float(kl(params)), float(kl(new.params))
    assert before == pytest.approx(losses[0], rel=1e-4)
    assert after < 0.9 * before and np.all(np.diff(losses) < 0), (losses, after)
    for (path, old), moved in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(new.params), strict=True
    ):
        name = jax.tree_util.keystr(path)
        if "so_draft" in name:
            assert np.any(np.asarray(moved) != np.asarray(old)), name
        else:
            np.testing.assert_array_equal(np.asarray(moved), np.asarray(old), err_msg=name)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: tiny_model(architecture="transformer", draft_scale_offset=True), "two-stream"),
        (lambda: tiny_model(scale_offset=False, draft_scale_offset=True), "scale_offset=True"),
        (lambda: LoopConfig(distill_draft_window=-1), "distill_draft_window"),
        (
            lambda: TrainConfig(
                model=tiny_model(), data=None, train=LoopConfig(distill_draft_window=8)
            ),
            "draft_scale_offset",
        ),
        (
            lambda: draft_kl_sums(OrthrosLM(tiny_model()), {}, {"output_positions": None}, 4),
            "PT batches",
        ),
    ],
)
def test_bad_draft_settings_are_one_line_errors(build, match):
    with pytest.raises(ValueError, match=match) as e:
        build()
    assert "\n" not in str(e.value)


def test_exports_drop_the_draft_so(model, tmp_path):
    cfg, params = model
    export_hf(str(tmp_path), cfg, jax.device_get(params))
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert any("so_out_scale" in n for n in names)
    assert not any("draft" in n for n in names), sorted(names)
    assert "draft" not in (tmp_path / "config.json").read_text()
