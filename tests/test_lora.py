"""Trainable subsets and LoRA (issue 36): frozen parameters get no optimizer state and do not
move, adapters ≡ their merged weights in every driver, peft export / import parity, bad input
refused before compiling, a resumed run may not change what trains."""

from __future__ import annotations

import json
import math
import os

import jax
import numpy as np
import pytest
from helpers import our_logits
from training_helpers import pt_batch, tiny_model

from orthros_jax import inference
from orthros_jax.layers import lora, registry
from orthros_jax.layers.kind import Role
from orthros_jax.model import init_params, param_decls
from orthros_jax.training import OptimizerConfig, init_train_state, make_optimizer
from orthros_jax.training.config import LoopConfig, TrainConfig
from orthros_jax.training.start import TRAINABLE_JSON, check_resumed_model
from orthros_jax.training.steps import make_train_step
from orthros_jax.training.trainable import trainable_subset

LORA = dict(rank=4, alpha=8.0)
OPT = OptimizerConfig(lr=1e-2, warmup_steps=0)


def _random_adapters(params, cfg, seed: int = 0):
    """params with every adapter factor drawn N(0, 0.1) (B starts at 0: a no-op adapter)."""
    base, adapters = lora.split(params, cfg)
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    drawn = [
        0.1 * jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves, strict=True)
    ]
    return lora.join(base, jax.tree.unflatten(tree, drawn))


@pytest.mark.parametrize("spec", ["all", "scale_offset", "lora", "layers/w(q|o)$"])
def test_frozen_parameters_have_no_optimizer_state(spec):
    """AdamW's two moments exist for exactly the trainable parameters (shapes only: no
    compile); the declared roles pick them."""
    cfg = tiny_model(lora=LORA)
    tx = make_optimizer(OPT, 4, cfg)
    subset = trainable_subset(cfg, spec)
    state = jax.eval_shape(
        lambda r: init_train_state(cfg, tx, r, None, subset), jax.random.PRNGKey(0)
    )
    moments = sum(math.prod(a.shape) for a in jax.tree.leaves(state.opt_state) if a.ndim)
    decls = jax.tree_util.tree_leaves_with_path(
        param_decls(cfg), is_leaf=lambda x: hasattr(x, "role")
    )
    chosen = set(subset.paths())
    trained = 0
    for path, d in decls:
        name = "/".join(str(k.key) for k in path)
        n = math.prod(d.shape) * (cfg.n_layers if len(path) > 1 else 1)
        trained += n * (name in chosen)
        if spec == "scale_offset":
            assert (name in chosen) == (d.role is Role.SCALE_OFFSET), name
        if spec == "lora":
            assert (name in chosen) == (d.role is not Role.WEIGHT), name
    assert moments == 2 * trained
    expected = {"all": None, "scale_offset": 4, "lora": 4 + 2 * 7, "layers/w(q|o)$": 2}[spec]
    if expected is not None:
        assert len(chosen) == expected


@pytest.mark.slow
def test_lora_step_moves_only_the_adapters_and_scale_offsets():
    cfg = tiny_model(lora=LORA)  # two layers: the last one's base-stream SO is dead
    tx = make_optimizer(OPT, 4, cfg)
    subset = trainable_subset(cfg, "lora")
    state = init_train_state(cfg, tx, jax.random.PRNGKey(0), None, subset)
    step = jax.jit(make_train_step(cfg, OPT, tx, 4, 0, subset))
    new, metrics = step(state, pt_batch(0, batch=2, seq=16))
    assert np.isfinite(float(metrics["loss"]))
    mask = subset.mask(state.params)
    for (path, old), m, moved in zip(
        jax.tree_util.tree_leaves_with_path(state.params),
        jax.tree.leaves(mask),
        jax.tree.leaves(new.params),
        strict=True,
    ):
        name = jax.tree_util.keystr(path)
        if not m:
            np.testing.assert_array_equal(np.asarray(moved), np.asarray(old), err_msg=name)
        elif not name.endswith("_lora_a']"):  # A's first gradient is 0 (B starts at 0)
            assert np.any(np.asarray(moved) != np.asarray(old)), name


def test_adapters_equal_their_merged_weights_in_every_driver():
    """The sequence forward (PT/SFT/RL), chunked prefill and decode (engine) of the un-merged
    model give the merged model's logits: the adapters are applied in the one layer loop."""
    cfg = tiny_model(lora=dict(LORA, targets=("wq", "wo", "w_down")), prefill_chunk=8)
    params = _random_adapters(init_params(cfg, jax.random.PRNGKey(1)), cfg)
    merged, plain = lora.merge(params, cfg)
    assert plain.lora is None and "wq_lora_a" not in merged["layers"]
    tokens = np.random.default_rng(0).integers(0, 256, (2, 24)).astype(np.int32)
    want = our_logits(plain, merged, tokens)
    base_only = our_logits(plain, lora.split(params, cfg)[0], tokens)
    assert np.max(np.abs(want - base_only)) > 1e-2  # the adapters matter
    np.testing.assert_allclose(our_logits(cfg, params, tokens), want, atol=2e-5, rtol=0)
    lengths, rows = np.array([7, 13]), np.arange(2)
    cache = inference.init_cache(cfg, 2, 24)
    logits, cache = inference.prefill(params, cache, tokens[:, :13], lengths, cfg)
    np.testing.assert_allclose(np.asarray(logits), want[rows, lengths - 1], atol=2e-5, rtol=0)
    for i in range(3):
        logits, cache = inference.decode_step(params, cache, tokens[rows, lengths + i], cfg)
        np.testing.assert_allclose(np.asarray(logits), want[rows, lengths + i], atol=2e-5, rtol=0)


def test_bad_lora_and_trainable_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"lora\.rank must be a positive int"):
        tiny_model(lora=dict(rank=0))
    with pytest.raises(ValueError, match=r"unknown target\(s\) \['q_proj'\]"):
        registry.validate(tiny_model(lora=dict(rank=4, targets=("wq", "q_proj"))))
    with pytest.raises(ValueError, match="needs model.lora"):
        trainable_subset(tiny_model(), "lora")
    with pytest.raises(ValueError, match="selects no parameter"):
        trainable_subset(tiny_model(architecture="transformer"), "scale_offset")
    with pytest.raises(ValueError, match="neither one of"):
        trainable_subset(tiny_model(), "layers/(wq")


def test_resuming_with_another_trainable_set_is_refused(tmp_path):
    from orthros_jax import checkpoint

    cfg = tiny_model(lora=LORA)
    checkpoint.write_model_json(str(tmp_path), cfg, None)
    os.makedirs(tmp_path / checkpoint.CHECKPOINTS_DIR / "2")
    (tmp_path / TRAINABLE_JSON).write_text(json.dumps({"trainable": "lora", "paths": []}))
    run = lambda spec: TrainConfig(cfg, None, train=LoopConfig(trainable=spec))
    check_resumed_model(run("lora"), str(tmp_path))  # the same set resumes
    with pytest.raises(ValueError, match=r"train.trainable='lora', not 'all'"):
        check_resumed_model(run("all"), str(tmp_path))
    os.remove(tmp_path / TRAINABLE_JSON)  # a workdir from before subsets: everything trained
    with pytest.raises(ValueError, match=r"train.trainable='all', not 'scale_offset'"):
        check_resumed_model(run("scale_offset"), str(tmp_path))


def _transformer_with_adapters():
    """A tiny Llama-shaped model's config and bare adapters (B random, so they matter)."""
    cfg = tiny_model(architecture="transformer", lora=dict(LORA, targets=("wq", "wv", "w_down")))
    return cfg, _random_adapters(lora.init_adapters(cfg, jax.random.PRNGKey(0)), cfg)


def test_bad_peft_adapters_are_one_line_errors(tmp_path):
    from safetensors.numpy import load_file, save_file

    from orthros_jax.convert.peft import ADAPTER_CONFIG, ADAPTER_WEIGHTS, export_peft, import_peft

    cfg, adapters = _transformer_with_adapters()
    export_peft(str(tmp_path), cfg, jax.device_get(adapters))
    plain, base = cfg.replace(lora=None), {"layers": {}}
    new_cfg, params = import_peft(str(tmp_path), plain, base)  # the round trip itself
    assert new_cfg.lora == cfg.lora.__class__(**{**LORA, "targets": new_cfg.lora.targets})
    for name, a in adapters["layers"].items():
        np.testing.assert_allclose(params["layers"][name], np.asarray(a), rtol=0, atol=0)
    tensors = load_file(str(tmp_path / ADAPTER_WEIGHTS))
    key = "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"

    def broken(t):
        save_file(t, str(tmp_path / ADAPTER_WEIGHTS))
        return lambda: import_peft(str(tmp_path), plain, base)

    with pytest.raises(ValueError, match=r"self_attn\.rotary\.lora_A\.weight'.*no such module"):
        broken({**tensors, key.replace("mlp.down_proj", "self_attn.rotary"): tensors[key]})()
    with pytest.raises(ValueError, match=r"down_proj\.lora_A\.weight: got \(4, 63\), expected"):
        broken({**tensors, key: tensors[key][:, :63]})()
    save_file(tensors, str(tmp_path / ADAPTER_WEIGHTS))
    conf = json.loads((tmp_path / ADAPTER_CONFIG).read_text())
    (tmp_path / ADAPTER_CONFIG).write_text(json.dumps(conf | {"r": 0}))
    with pytest.raises(ValueError, match=r"lora\.rank must be a positive int, got 0"):
        import_peft(str(tmp_path), plain, base)


@pytest.mark.slow
def test_peft_import_and_export_give_peft_logits(tmp_path):
    """A peft LoRA adapter made with peft on a tiny random Llama loads onto our imported model
    with peft's logits; our adapters exported next to the base load back in
    PeftModel.from_pretrained with our logits (≤ 1e-5 relative)."""
    peft = pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    import transformers
    from helpers import hf_logits

    from orthros_jax.convert import export_hf, load_hf
    from orthros_jax.convert.peft import import_peft

    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=64,
        )
    ).eval()
    llama.save_pretrained(str(tmp_path / "hf"))
    targets = ["q_proj", "v_proj", "o_proj", "down_proj"]
    model = peft.get_peft_model(llama, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    model.save_pretrained(str(tmp_path / "adapter"))
    tokens = np.random.default_rng(0).integers(0, 256, (2, 16))
    rel = lambda got, want: np.max(np.abs(got - want)) / np.max(np.abs(want))

    cfg, params = load_hf(str(tmp_path / "hf"))
    cfg, params = import_peft(str(tmp_path / "adapter"), cfg, params)
    assert sorted(cfg.lora.targets) == ["w_down", "wo", "wq", "wv"]
    assert rel(our_logits(cfg, params, tokens), hf_logits(model.eval(), tokens)) <= 1e-5

    params = _random_adapters(params, cfg, seed=7)  # "trained here"
    export_hf(str(tmp_path / "out"), cfg, params, peft_adapter=True)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    loaded = peft.PeftModel.from_pretrained(base, str(tmp_path / "out")).eval()
    assert rel(hf_logits(loaded, tokens), our_logits(cfg, params, tokens)) <= 1e-5


@pytest.mark.slow
def test_grpo_engine_gets_the_merged_policy_each_step_without_recompiling(tmp_path, monkeypatch):
    from test_rl_run import AsciiPrompts, _cfg

    from orthros_jax.rl import loop as rl_loop
    from orthros_jax.rl import tasks
    from orthros_jax.serving import device

    monkeypatch.setitem(tasks.TASKS, "ascii", AsciiPrompts)
    base = _cfg()
    cfg = base.__class__(
        **{
            **base.__dict__,
            "model": base.model.replace(lora=LORA),
            "train": base.train.__class__(**{**base.train.__dict__, "trainable": "lora"}),
        }
    )
    rr = rl_loop._Run(cfg, str(tmp_path))
    prompts = rr.prompts(tasks.TRAIN_STREAM, 0, 2)
    params = init_params(cfg.model, jax.random.PRNGKey(0))
    rr.sample(params, prompts, 2, 1.0, step=0)  # builds and compiles the engine
    compiles = device.compile_count()
    policy = _random_adapters(params, cfg.model)  # an update moved the adapters
    rr.sample(policy, prompts, 2, 1.0, step=1)
    assert device.compile_count() == compiles and rr.merge._cache_size() == 1
    merged, _ = lora.merge(policy, cfg.model)
    assert "wq_lora_a" not in rr.engine.params["layers"]
    for name in ("wq", "w_down"):  # the engine ran step 1's rollouts with the merged policy
        np.testing.assert_allclose(
            np.asarray(rr.engine.params["layers"][name]), np.asarray(merged["layers"][name]), atol=0
        )
