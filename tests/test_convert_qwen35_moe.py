"""Qwen3.5-MoE (Qwen3_5MoeForCausalLM) import/export against transformers: logits on tiny
random configs (a GDN / attention cycle and an attention-only model; GQA, shared expert, top-k
> 1, tied embeddings, the aux loss), both expert layouts and the multimodal text prefix, export
round trip, conversion to Orthros-H / Orthros, refusal of what the block does not have, and
launch/convert.py."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from helpers import convert_cli_to_orthros, hf_logits, our_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig  # noqa: E402

from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.convert import export_hf, from_transformer, load_hf  # noqa: E402
from orthros_jax.convert.hf_weights import write_safetensors  # noqa: E402
from orthros_jax.convert.qwen35_config import is_qwen35  # noqa: E402
from orthros_jax.convert.qwen35_moe import (  # noqa: E402
    config_from_qwen35_moe,
    is_qwen35_moe,
    qwen35_moe_config_from,
)

ATOL = 1e-4
T = 24
GDN = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=6,
    linear_conv_kernel_dim=4,
)
CONFIGS = {
    # [GDN, attention] twice: GQA in both kinds (Hv = 2 Hk), partial rotary 0.5, 4 experts top-2.
    "hybrid": dict(
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        num_experts=4,
        num_experts_per_tok=2,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    ),
    # Attention only (the transformer arm): tied embeddings, 6 experts top-3, the aux loss on.
    "attention_tied": dict(
        num_hidden_layers=2,
        layer_types=["full_attention"] * 2,
        num_experts=6,
        num_experts_per_tok=3,
        tie_word_embeddings=True,
        output_router_logits=True,
        router_aux_loss_coef=0.02,
    ),
}


def _hf_config(name: str) -> Qwen3_5MoeTextConfig:
    return Qwen3_5MoeTextConfig(
        vocab_size=97,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        rms_norm_eps=1e-6,
        **GDN,
        **CONFIGS[name],
    )


def _hf_model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(_hf_config(name)).eval()
    with torch.no_grad():  # zero-init norms, unit gates and a flat router would hide mistakes
        for pname, prm in model.named_parameters():
            if pname.endswith("norm.weight") or pname.endswith("dt_bias"):
                prm.add_(0.3 * torch.randn_like(prm))
            elif pname.endswith("mlp.gate.weight"):
                prm.normal_(0.0, 1.0)  # routers far from uniform, so top-k decides something
            elif prm.ndim > 1:
                prm.normal_(0.0, 0.1)
    return model


def _tokens(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 97, (2, T))


def _fused_prefixed_dir(model, path) -> None:
    """The model's own (fused) tensors under a multimodal checkpoint's text prefix, with the
    mtp / vision tensors a text model ignores."""
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    renamed = {
        ("model.language_model." + k[len("model.") :] if k.startswith("model.") else k): v
        for k, v in state.items()
    }
    renamed["mtp.fc.weight"] = np.ones((4, 4), np.float32)
    renamed["model.visual.patch_embed.weight"] = np.ones((4, 4), np.float32)
    write_safetensors(str(path), renamed)
    (path / "config.json").write_text(model.config.to_json_string())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_import_logits_match_transformers_and_export_round_trips(name, tmp_path):
    model = _hf_model(name)
    model.save_pretrained(tmp_path / "hf")  # the per-expert layout
    with open(tmp_path / "hf" / "config.json") as f:
        assert json.load(f)["architectures"] == ["Qwen3_5MoeForCausalLM"]
    cfg, params = load_hf(str(tmp_path / "hf"), kinds=dict(gdn=dict(chunk=16)))
    own = "hybrid" if name == "hybrid" else "transformer"
    assert cfg.architecture == own and cfg.attn_output_gate and cfg.norm_zero_centered
    assert cfg.moe is not None and cfg.moe.shared_expert == 24 and cfg.moe.norm_topk_prob
    assert cfg.moe.aux_loss_coef == (0.02 if name == "attention_tied" else 0.0)
    toks = _tokens()
    want = hf_logits(model, toks)
    np.testing.assert_allclose(our_logits(cfg, params, toks), want, atol=ATOL, rtol=0)
    dense = cfg.replace(moe=cfg.moe.replace(impl="dense"))  # the experts' reference kernel
    np.testing.assert_allclose(our_logits(dense, params, toks), want, atol=ATOL, rtol=0)
    # The fused layout under the multimodal text prefix: the very same params, and transformers
    # reads it to the same logits.
    _fused_prefixed_dir(model, tmp_path / "fused")
    _, fused = load_hf(str(tmp_path / "fused"), kinds=dict(gdn=dict(chunk=16)))
    jax.tree.map(np.testing.assert_array_equal, fused, params)
    again = Qwen3_5MoeForCausalLM.from_pretrained(str(tmp_path / "fused")).eval()
    np.testing.assert_allclose(hf_logits(again, toks), want, atol=1e-6, rtol=0)
    # Export, reload with transformers: the same function and the very same tensors.
    export_hf(str(tmp_path / "out"), cfg, params)
    back = Qwen3_5MoeForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    np.testing.assert_allclose(hf_logits(back, toks), want, atol=ATOL, rtol=0)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[key].numpy(), value.numpy(), err_msg=key)
    assert back.config.output_router_logits == (name == "attention_tied")


@pytest.mark.slow
def test_orthros_h_and_orthros_conversions_reproduce_the_source(tmp_path):
    # Hybrid -> Orthros-H (independent routing, the one its GDN layers allow): with q's conv
    # the identity (the cross query skips it: test_convert_qwen35.py) and the window covering
    # the prompt, the hybrid's function.
    model = _hf_model("hybrid", seed=1)
    model.save_pretrained(tmp_path / "hybrid")
    cfg, params = load_hf(str(tmp_path / "hybrid"), window=T)
    ocfg, oparams = from_transformer(params, cfg)
    assert ocfg.architecture == "orthros_h" and ocfg.moe_routing == "independent"
    for key in ("moe", "layers", "gdn_layers"):
        for pname, value in params[key].items():
            np.testing.assert_array_equal(oparams[key][pname], value)
    conv_q = np.zeros_like(params["gdn_layers"]["gdn_conv_q"])
    conv_q[:, -1] = 1.0
    base = {k: dict(v) if isinstance(v, dict) else v for k, v in params.items()}
    ident = {k: dict(v) if isinstance(v, dict) else v for k, v in oparams.items()}
    base["gdn_layers"]["gdn_conv_q"] = ident["gdn_layers"]["gdn_conv_q"] = conv_q
    toks = _tokens(1)
    np.testing.assert_allclose(
        our_logits(ocfg, ident, toks), our_logits(cfg, base, toks), atol=2e-4, rtol=0
    )
    # Attention only -> Orthros (paired routing): transformers' logits themselves.
    model = _hf_model("attention_tied", seed=2)
    model.save_pretrained(tmp_path / "attn")
    cfg, params = load_hf(str(tmp_path / "attn"), window=T)
    ocfg, oparams = from_transformer(params, cfg)
    assert ocfg.architecture == "orthros" and ocfg.moe_routing == "paired"
    want = hf_logits(model, toks)
    np.testing.assert_allclose(our_logits(ocfg, oparams, toks), want, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="single-stream"):
        export_hf(str(tmp_path / "orthros_out"), ocfg, oparams, fmt="hf")


def test_unsupported_options_are_refused_by_name(tmp_path):
    base = _hf_config("hybrid").to_dict()
    assert is_qwen35_moe(base) and not is_qwen35(base)
    cfg = config_from_qwen35_moe(base)
    assert cfg.architecture == "hybrid" and cfg.moe is not None
    assert cfg.moe.ffn_cycle == ("moe",) and cfg.moe.routing == "independent"
    refused = {
        "mlp_only_layers": [1],  # Qwen3.5-MoE has no dense layers
        "decoder_sparse_step": 2,
        "norm_topk_prob": False,  # its router always renormalises
        "first_k_dense_replace": 1,
        "n_shared_experts": 2,
        "shared_expert_intermediate_size": 0,
        "attention_bias": True,
        "hidden_act": "gelu",
    }
    for key, value in refused.items():
        with pytest.raises(ValueError, match=key):
            config_from_qwen35_moe(base | {key: value})
    # The neutral values of the keys the block does not have pass.
    neutral = {"mlp_only_layers": [], "decoder_sparse_step": 1, "norm_topk_prob": True}
    assert config_from_qwen35_moe(base | neutral) == cfg
    with pytest.raises(ValueError, match="num_experts"):
        config_from_qwen35_moe({k: v for k, v in base.items() if k != "num_experts"})
    with pytest.raises(ValueError, match="top_k"):
        config_from_qwen35_moe(base | {"num_experts_per_tok": 5})
    with pytest.raises(ValueError, match="ffn_cycle"):
        config_from_qwen35_moe(base, moe=dict(ffn_cycle=("dense", "moe")))
    mm = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe"}
    (tmp_path / "config.json").write_text(json.dumps(mm))
    with pytest.raises(ValueError, match="expected Qwen3_5MoeForCausalLM"):
        load_hf(str(tmp_path))
    # Export: only the Qwen3.5-MoE block.
    for field, value in (("shared_expert", 0), ("norm_topk_prob", False)):
        with pytest.raises(ValueError, match=f"ModelConfig.moe.{field}"):
            qwen35_moe_config_from(cfg.replace(moe=cfg.moe.replace(**{field: value})))
    hf = qwen35_moe_config_from(cfg)
    assert "intermediate_size" not in hf and hf["shared_expert_intermediate_size"] == 24
    assert config_from_qwen35_moe(hf) == cfg


@pytest.mark.slow
def test_convert_cli_imports_qwen35_moe_as_orthros_h(tmp_path):
    _hf_model("hybrid", seed=3).save_pretrained(tmp_path / "hf")
    out = tmp_path / "model"
    convert_cli_to_orthros(tmp_path / "hf", out, T)
    loaded = checkpoint.load_model(str(out))
    assert loaded.cfg.architecture == "orthros_h" and loaded.cfg.moe is not None
    assert loaded.cfg.moe.shared_expert == 24 and loaded.cfg.moe_routing == "independent"
    assert loaded.params["moe"]["shared_router"].shape == (4, 32, 1)
