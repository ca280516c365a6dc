"""Qwen3.5 (Qwen3_5ForCausalLM) import/export against transformers: logits on tiny random
configs (layer_types cycles, GQA in both kinds, partial rotary, output gate, zero-centred
norms), export round trip, Qwen3.5 -> Orthros-H, refusal of MoE keys and the multimodal
wrapper, and launch/convert.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import convert_cli_to_orthros, hf_logits, our_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

from orthros_jax import checkpoint  # noqa: E402
from orthros_jax.convert import export_hf, from_transformer, load_hf  # noqa: E402
from orthros_jax.convert.qwen35_config import is_qwen35, layer_cycle  # noqa: E402

ATOL = 1e-4
T = 40
CONFIGS = {
    # Qwen3.5's cycle (3 GDN + 1 attention) twice, GQA in attention and in GDN (Hv = 2 Hk).
    "cycle4": dict(
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=6,
        linear_conv_kernel_dim=4,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    ),
    # A [GDN, attention] cycle, tied embeddings, Hv = Hk, the default partial rotary 0.25.
    "cycle2_tied": dict(
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=3,
        tie_word_embeddings=True,
        layer_types=["linear_attention", "full_attention"] * 2,
    ),
    # transformers' partial rotary for an odd int(head_dim * factor) = 3: it rotates the first
    # 4 dims with frequencies theta^(-2i/3), i = 0, 1 (once refused here).
    "odd_rotary": dict(
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=12,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    ),
}


def _hf_model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, rms_norm_eps=1e-6, **CONFIGS[name]
    )
    model = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():  # zero-init norms and unit gates would hide layout mistakes
        for pname, prm in model.named_parameters():
            if pname.endswith("norm.weight") or pname.endswith("dt_bias"):
                prm.add_(0.3 * torch.randn_like(prm))
            elif "conv1d" in pname or "proj" in pname or "embed" in pname or "lm_head" in pname:
                prm.normal_(0.0, 0.1)
    return model


def _tokens(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 97, (2, T))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_import_logits_match_transformers_and_export_round_trips(name, tmp_path):
    model = _hf_model(name)
    model.save_pretrained(tmp_path / "hf")
    # gdn_chunk 16: the prompt spans three chunks of the chunked rule.
    cfg, params = load_hf(str(tmp_path / "hf"), kinds=dict(gdn=dict(chunk=16)))
    assert cfg.architecture == "hybrid" and cfg.attn_output_gate and cfg.norm_zero_centered
    assert cfg.layer_types == layer_cycle(model.config.layer_types)
    toks = _tokens()
    want = hf_logits(model, toks)
    np.testing.assert_allclose(our_logits(cfg, params, toks), want, atol=ATOL, rtol=0)
    # Export, reload with transformers: the same function and the very same tensors.
    export_hf(str(tmp_path / "out"), cfg, params)
    again = Qwen3_5ForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    np.testing.assert_allclose(hf_logits(again, toks), want, atol=ATOL, rtol=0)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[key].numpy(), value.numpy(), err_msg=key)


@pytest.mark.slow
def test_orthros_h_conversion_adds_identity_so_only(tmp_path):
    model = _hf_model("cycle4", seed=1)
    model.save_pretrained(tmp_path / "hf")
    cfg, params = load_hf(str(tmp_path / "hf"), window=T)
    ocfg, oparams = from_transformer(params, cfg)
    assert ocfg.architecture == "orthros_h" and ocfg.two_streams and ocfg.window == T
    new = {(k, n) for k, s in oparams.items() if isinstance(s, dict) for n in s} - {
        (k, n) for k, s in params.items() if isinstance(s, dict) for n in s
    }
    assert new == {
        ("layers", f"so_{s}_{p}") for s in ("base", "out") for p in ("scale", "offset")
    } | {("gdn_layers", "gdn_so_out_scale"), ("gdn_layers", "gdn_so_out_offset")}
    for key in ("layers", "gdn_layers"):
        for name, value in params[key].items():
            np.testing.assert_array_equal(oparams[key][name], value)
    np.testing.assert_array_equal(oparams["gdn_layers"]["gdn_so_out_scale"], 1.0)
    np.testing.assert_array_equal(oparams["gdn_layers"]["gdn_so_out_offset"], 0.0)
    toks = _tokens(1)
    hybrid = our_logits(cfg, params, toks)
    # The cross query skips the conv: with q's conv the identity (last tap 1) and the window
    # covering the prompt, Orthros-H is the hybrid's function. Tolerance: this random 8-layer
    # model amplifies rounding (the GDN chunk 64 vs 16 alone moves its logits by 2e-5, and the
    # output stream reads by the global kernel where the hybrid's base reads by the window's).
    ident = {k: dict(v) if isinstance(v, dict) else v for k, v in oparams.items()}
    conv_q = np.zeros_like(ident["gdn_layers"]["gdn_conv_q"])
    conv_q[:, -1] = 1.0
    ident["gdn_layers"]["gdn_conv_q"] = conv_q
    base = {k: dict(v) if isinstance(v, dict) else v for k, v in params.items()}
    base["gdn_layers"]["gdn_conv_q"] = conv_q
    np.testing.assert_allclose(
        our_logits(ocfg, ident, toks), our_logits(cfg, base, toks), atol=2e-4, rtol=0
    )
    # With the checkpoint's own conv the output stream's GDN read differs from the hybrid's.
    gap = np.abs(our_logits(ocfg, oparams, toks) - hybrid).max()
    print(f"Orthros-H (identity SO, own conv) vs hybrid: max |logit gap| {gap:.4f}")
    assert gap > 1e-2


def test_moe_keys_and_multimodal_refused_by_name(tmp_path):
    # Qwen3.5-MoE is its own importer (tests/test_convert_qwen35_moe.py), not this one.
    assert not is_qwen35({"architectures": ["Qwen3_5MoeForCausalLM"]})
    dense = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text"}
    (tmp_path / "config.json").write_text(json.dumps(dense | {"num_experts": 8}))
    with pytest.raises(ValueError, match="num_experts.*Qwen3_5MoeForCausalLM"):
        load_hf(str(tmp_path))
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5"})
    )
    with pytest.raises(ValueError, match="expected Qwen3_5ForCausalLM"):
        load_hf(str(tmp_path))


@pytest.mark.slow
def test_convert_cli_imports_qwen35_as_orthros_h(tmp_path):
    model = _hf_model("cycle2_tied", seed=2)
    model.save_pretrained(tmp_path / "hf")
    out = tmp_path / "model"
    convert_cli_to_orthros(tmp_path / "hf", out, T)
    loaded = checkpoint.load_model(str(out))
    assert loaded.cfg.architecture == "orthros_h" and loaded.cfg.layer_types == ("gdn", "attention")
    np.testing.assert_array_equal(np.asarray(loaded.params["gdn_layers"]["gdn_so_out_scale"]), 1.0)
