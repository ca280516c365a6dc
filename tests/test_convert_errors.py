"""HF Llama/Qwen3 conversion errors: configs, tensors, files and exports that do not fit are
refused with a ValueError naming what (random numpy weights written as safetensors: no torch,
no transformers)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import tiny_config

from orthros_jax.config import ModelConfig
from orthros_jax.convert import (
    config_from_hf,
    export_hf,
    from_transformer,
    hf_config_from,
    hf_tensor_shapes,
    load_hf,
    params_from_hf,
    write_safetensors,
)

SMALL = tiny_config(
    vocab_size=32,
    d_model=16,
    n_heads=2,
    n_kv_heads=1,
    d_ff=32,
    window=128,
    architecture="transformer",
)


def _random_hf(cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Random HF-named tensors for cfg (numpy only: no torch, no jax compile)."""
    rng = np.random.default_rng(0)
    return {
        n: rng.normal(size=shape).astype(np.float32) for n, shape in hf_tensor_shapes(cfg).items()
    }


def _write_hf(directory, cfg: ModelConfig, edit=None, config_edit=None) -> str:
    """A HF dir for cfg (random weights, no torch); edit/config_edit mutate tensors/config."""

    tensors = _random_hf(cfg)
    config = hf_config_from(cfg)
    if edit:
        edit(tensors)
    if config_edit:
        config_edit(config)
    write_safetensors(str(directory), tensors)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    return str(directory)


def _llama(**changes):
    return {**hf_config_from(SMALL), **changes}


@pytest.mark.parametrize(
    "config, pattern",
    [
        (
            _llama(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=8),
            r"Qwen3MoeForCausalLM.*mixture-of-experts.*"
            r"supported: LlamaForCausalLM, Qwen3ForCausalLM",
        ),
        (
            _llama(architectures=["MixtralForCausalLM"], model_type="mixtral"),
            r"MixtralForCausalLM.*supported: LlamaForCausalLM, Qwen3ForCausalLM",
        ),
        (_llama(architectures=None, model_type="gpt2"), r"model_type 'gpt2'.*supported"),
        (_llama(rope_scaling={"rope_type": "yarn", "factor": 4.0}), r"'yarn'.*default, llama3"),
        (_llama(rope_scaling={"type": "linear", "factor": 2.0}), r"'linear'.*default, llama3"),
        (
            _llama(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4}),
            r"'dynamic'.*default, llama3",
        ),
        (_llama(attention_bias=True), r"attention_bias=True.*expected attention_bias=False"),
        (_llama(mlp_bias=True), r"mlp_bias=True.*expected mlp_bias=False"),
        (_llama(hidden_act="gelu"), r"hidden_act='gelu'.*expected 'silu'"),
        (_llama(model_type="qwen3"), r"LlamaForCausalLM but model_type 'qwen3'.*'llama'"),
        ({"architectures": ["LlamaForCausalLM"]}, r"lacks required field\(s\) \['vocab_size'"),
    ],
)
def test_config_errors(config, pattern):
    with pytest.raises(ValueError, match=pattern):
        config_from_hf(config)


def _drop(name):
    return lambda t: t.pop(name)


def _add(name):
    return lambda t: t.update({name: np.zeros((3,), np.float32)})


def _reshape(name, shape):
    return lambda t: t.update({name: np.zeros(shape, np.float32)})


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (_drop("model.layers.1.mlp.up_proj.weight"), r"missing 1 .*model\.layers\.1\.mlp\.up_proj"),
        (_drop("lm_head.weight"), r"missing 1 .*untied embeddings needs: \['lm_head\.weight'\]"),
        (
            _add("model.layers.2.mlp.up_proj.weight"),
            r"unexpected .*'model\.layers\.2\.mlp\.up_proj",
        ),
        (
            _add("model.layers.0.self_attn.q_norm.weight"),
            r"unexpected .* Llama model.*'model\.layers\.0\.self_attn\.q_norm\.weight'",
        ),
        (
            _reshape("model.layers.0.self_attn.k_proj.weight", (16, 16)),
            r"'model\.layers\.0\.self_attn\.k_proj\.weight' "
            r"has shape \[16, 16\]; expected \[8, 16\]",
        ),
    ],
)
def test_tensor_errors(tmp_path, edit, pattern):
    hf_dir = _write_hf(tmp_path, SMALL, edit=edit)
    with pytest.raises(ValueError, match=pattern):
        load_hf(hf_dir)


def test_tensor_name_and_file_errors(tmp_path):
    tied = SMALL.replace(tie_embeddings=True)
    add_head = lambda t: t.update({"lm_head.weight": np.ones((32, 16), np.float32)})
    with pytest.raises(ValueError, match=r"ties embeddings but 'lm_head.weight' differs"):
        load_hf(_write_hf(tmp_path / "tied", tied, edit=add_head))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_norm\.weight"):
        params_from_hf(_random_hf(SMALL), SMALL.replace(qk_norm=True))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"")
    (tmp_path / "bin" / "config.json").write_text(json.dumps(hf_config_from(SMALL)))
    with pytest.raises(ValueError, match=r"neither model\.safetensors nor .*pytorch_model\.bin"):
        load_hf(str(tmp_path / "bin"))
    with pytest.raises(ValueError, match=r"has no config\.json"):
        load_hf(str(tmp_path / "missing"))


def test_conversion_and_export_errors(tmp_path):
    params = params_from_hf(_random_hf(SMALL), SMALL)
    ocfg, oparams = from_transformer(params, SMALL)
    with pytest.raises(ValueError, match=r"needs architecture='transformer'.*got 'orthros'"):
        from_transformer(oparams, ocfg)
    # Orthros leaves as trust_remote_code (tests/test_export_remote.py); transformers' own Llama
    # class has no output stream, so asking for it is refused by name.
    with pytest.raises(ValueError, match=r"only architecture='transformer' exports.*'orthros'"):
        export_hf(str(tmp_path / "o"), ocfg, oparams, remote=False)
    with pytest.raises(ValueError, match=r"missing \[\].*unexpected \['layers/so_base_offset'"):
        export_hf(str(tmp_path / "o"), SMALL, oparams)
