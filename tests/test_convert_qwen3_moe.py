"""Qwen3-MoE in and out: logits equal transformers' CPU path, the export reloads to the same
logits, conversion to Orthros with a global window reproduces them (ours, and its
trust_remote_code export in transformers); unsupported options refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import hf_logits

from orthros_jax import convert
from orthros_jax.model import OrthrosLM

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T = 11


def _hf_model(**changes):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    kw = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        initializer_range=0.2,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**(kw | changes))).eval()
    with torch.no_grad():  # routers far from uniform, so top-k decides something
        for name, w in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                w.copy_(torch.randn_like(w))
    return model


def _ours(cfg, params, tokens):
    fwd = jax.jit(lambda p, t: OrthrosLM(cfg).apply({"params": p}, t))
    return np.asarray(fwd(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens)))


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [
        dict(mlp_only_layers=[1], norm_topk_prob=True),
        dict(decoder_sparse_step=2, norm_topk_prob=False),
        dict(mlp_only_layers=[0, 3], norm_topk_prob=False, num_experts_per_tok=3),
    ],
)
def test_qwen3_moe_import_export_and_orthros_match_transformers(tmp_path, changes):
    model = _hf_model(**changes)
    tokens = np.random.default_rng(0).integers(0, 64, (2, T))
    want = hf_logits(model, tokens)
    model.save_pretrained(tmp_path / "hf")
    cfg, params = convert.load_hf(str(tmp_path / "hf"))
    assert cfg.moe is not None and cfg.architecture == "transformer"
    np.testing.assert_allclose(_ours(cfg, params, tokens), want, atol=1e-4, rtol=0)
    # the grouped kernel and the dense reference agree on the converted model
    dense = cfg.replace(moe=cfg.moe.replace(impl="dense"))
    np.testing.assert_allclose(_ours(dense, params, tokens), want, atol=1e-4, rtol=0)
    # Orthros with window >= T and identity SO (paired routing) reproduces the source
    ocfg, oparams = convert.from_transformer(params, cfg, window=T)
    assert ocfg.moe_routing == "paired"
    np.testing.assert_allclose(_ours(ocfg, oparams, tokens), want, atol=1e-4, rtol=0)
    # export back: transformers reloads it to the same logits
    convert.export_hf(str(tmp_path / "out"), cfg, params)
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    np.testing.assert_allclose(hf_logits(back, tokens), want, atol=1e-5, rtol=0)
    # the Orthros-MoE leaves as trust_remote_code (its default) with the source's logits too
    convert.export_hf(str(tmp_path / "orthros"), ocfg, oparams)
    remote = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "orthros"), trust_remote_code=True
    ).eval()
    np.testing.assert_allclose(hf_logits(remote, tokens), want, atol=1e-4, rtol=0)


def test_unsupported_qwen3_moe_options_are_refused_by_name():
    base = _hf_model().config.to_dict()
    with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
        convert.config_from_qwen3_moe(base | {"shared_expert_intermediate_size": 8})
    with pytest.raises(ValueError, match="mlp_only_layers"):
        convert.config_from_qwen3_moe(base | {"mlp_only_layers": [0, 1, 2, 3]})
    with pytest.raises(ValueError, match="hidden_act"):
        convert.config_from_qwen3_moe(base | {"hidden_act": "gelu"})
    with pytest.raises(ValueError, match="top_k"):
        convert.config_from_qwen3_moe(base | {"num_experts_per_tok": 5})
