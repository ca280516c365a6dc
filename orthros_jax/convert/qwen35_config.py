"""Hugging Face Qwen3.5 config.json <-> ModelConfig: the dense text model `Qwen3_5ForCausalLM`
here, and what its mixture-of-experts variant (qwen35_moe.py) shares with it.

`layer_types` repeats a cycle of "linear_attention" (gated DeltaNet, our kind "gdn") and
"full_attention" (our "attention") layers; a config with both kinds imports as the `hybrid`
arm (all linear: `gdn`; all full attention: `transformer`), or as their two-stream conversion
(`orthros_h` / `orthros`). The attention conventions (q/k norm, sigmoid output gate, partial
rotary, zero-centred norms) are fixed; biases, other activations and rope types are refused by
name, and so is the multimodal wrapper, before any tensor is read. The tensors: qwen35.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orthros_jax.config import ModelConfig
from orthros_jax.config.architectures import TWO_STREAM_FORM
from orthros_jax.convert.common import config_with, own_arm
from orthros_jax.convert.gdn_hf import GDN_CONFIG_KEYS
from orthros_jax.convert.hf_config import shape_fields
from orthros_jax.layers import attention, gdn

QWEN35, QWEN35_TYPE = "Qwen3_5ForCausalLM", "qwen3_5_text"
GDN, ATTENTION = gdn.KIND.name, attention.KIND.name
HF_KIND = {"linear_attention": GDN, "full_attention": ATTENTION}
OUR_KIND = {v: k for k, v in HF_KIND.items()}


def own_arms() -> tuple[str, ...]:
    """The single-stream arms a Qwen3.5 checkpoint imports as (common.own_arm of its kind set:
    GDN only, GDN and attention, attention only)."""
    return tuple(own_arm(*kinds) for kinds in ((GDN,), (GDN, ATTENTION), (ATTENTION,)))


_MOE_KEYS = ("num_experts", "num_local_experts", "moe_intermediate_size", "num_experts_per_tok")


def qwen35_family(hf: Mapping[str, Any]) -> str | None:
    """The Qwen3.5 family of a config.json dict: "moe" for its mixture-of-experts variant
    (Qwen3_5Moe* / qwen3_5_moe*), "dense" for any other Qwen3.5 one, None for other models."""
    archs = [str(a) for a in hf.get("architectures") or []]
    model_type = str(hf.get("model_type") or "")
    if any(a.startswith("Qwen3_5Moe") for a in archs) or model_type.startswith("qwen3_5_moe"):
        return "moe"
    if any(a.startswith("Qwen3_5") for a in archs) or model_type.startswith("qwen3_5"):
        return "dense"
    return None


def is_qwen35(hf: Mapping[str, Any]) -> bool:
    """Whether a config.json dict is a dense Qwen3.5 one (its MoE variant: qwen35_moe.py)."""
    return qwen35_family(hf) == "dense"


def check_config(hf: Mapping[str, Any], arch: str = QWEN35, model_type: str = QWEN35_TYPE) -> None:
    """ValueError, naming the option, unless hf is a text model `arch` / `model_type` whose
    attention and MLP activation are Qwen3.5's (no bias, SiLU, default rope)."""
    archs = list(hf.get("architectures") or [arch])
    if archs != [arch] or hf.get("model_type", model_type) != model_type:
        raise ValueError(
            f"unsupported Qwen3.5 config (architectures {archs}, model_type "
            f"{hf.get('model_type')!r}): expected {arch} / {model_type!r}, the text model "
            "(save the language model of a multimodal checkpoint on its own)"
        )
    if hf.get("attention_bias"):
        raise ValueError("unsupported attention_bias=True: expected False (no bias terms)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act={hf['hidden_act']!r}; expected 'silu'")
    rope = dict(hf.get("rope_parameters") or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rope_type {rope['rope_type']!r}; expected 'default'")


def layer_cycle(hf_layer_types: list[str]) -> tuple[str, ...]:
    """The shortest cycle of our kinds that repeats into the HF per-layer `layer_types`."""
    unknown = sorted(set(hf_layer_types) - set(HF_KIND))
    if unknown or not hf_layer_types:
        raise ValueError(
            f"Qwen3.5 layer_types {unknown or hf_layer_types}: expected a non-empty list of "
            f"{', '.join(HF_KIND)}"
        )
    kinds = [HF_KIND[t] for t in hf_layer_types]
    n = len(kinds)
    for p in range(1, n + 1):
        if n % p == 0 and all(kinds[i] == kinds[i % p] for i in range(n)):
            return tuple(kinds[:p])
    raise AssertionError("unreachable: p = n always repeats")


def config_from_qwen35(
    hf: Mapping[str, Any], *, architecture: str | None = None, window: int = 128, **overrides: Any
) -> ModelConfig:
    """ModelConfig of a Qwen3.5 config.json dict: the checkpoint's own arm by default (hybrid,
    gdn or transformer), or its two-stream conversion (orthros_h / orthros)."""
    check_config(hf)
    moe = [k for k in _MOE_KEYS if hf.get(k)]
    if moe:
        raise ValueError(
            f"unsupported {QWEN35} config with mixture-of-experts keys ({', '.join(moe)} set): "
            "expected Qwen3_5MoeForCausalLM for those"
        )
    fields = qwen35_fields(hf, architecture, window)
    return config_with(fields | {"d_ff": int(hf.get("intermediate_size", 12288))}, overrides)


def qwen35_fields(hf: Mapping[str, Any], architecture: str | None, window: int) -> dict[str, Any]:
    """The ModelConfig fields of a checked Qwen3.5 config.json dict but the FFN's (d_ff,
    moe): shapes, attention conventions, layer cycle, GDN options and the arm."""
    n_layers = int(hf.get("num_hidden_layers", 32))
    types = hf.get("layer_types") or [
        "linear_attention"
        if (i + 1) % int(hf.get("full_attention_interval", 4))
        else "full_attention"
        for i in range(n_layers)
    ]
    if len(types) != n_layers:
        raise ValueError(f"layer_types has {len(types)} entries for {n_layers} layers")
    cycle = layer_cycle(list(types))
    own = own_arm(*cycle)
    allowed = (own, TWO_STREAM_FORM[own]) if own in TWO_STREAM_FORM else (own,)
    architecture = architecture or own
    if architecture not in allowed:
        raise ValueError(
            f"a Qwen3.5 checkpoint with layer kinds {sorted(set(cycle))} imports as "
            f"{' or '.join(allowed)}, not {architecture!r}"
        )
    rope = dict(hf.get("rope_parameters") or {})
    fields: dict[str, Any] = dict(
        vocab_size=int(hf.get("vocab_size", 248320)),
        d_model=int(hf.get("hidden_size", 4096)),
        n_layers=n_layers,
        n_heads=int(hf.get("num_attention_heads", 16)),
        n_kv_heads=int(hf.get("num_key_value_heads", 4)),
        head_dim=int(hf.get("head_dim") or 256),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qk_norm=True,
        attn_output_gate=True,
        norm_zero_centered=True,
        partial_rotary_factor=float(
            rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
        ),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0))),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        layer_types=cycle,
        window=window,
        architecture=architecture,
        kinds={
            GDN: dict(
                num_k_heads=int(hf.get("linear_num_key_heads", 16)),
                num_v_heads=int(hf.get("linear_num_value_heads", 32)),
                k_head_dim=int(hf.get("linear_key_head_dim", 128)),
                v_head_dim=int(hf.get("linear_value_head_dim", 128)),
                conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)),
            )
        },
    )
    return fields


def qwen35_config_from(cfg: ModelConfig, *, torch_dtype: str | None = None) -> dict[str, Any]:
    """config.json of a single-stream model with Qwen3.5's conventions (gdn / hybrid, or a
    transformer with q/k norm, output gate and zero-centred norms) and dense FFNs."""
    if cfg.moe is not None:
        raise ValueError(f"{QWEN35} has dense FFNs; ModelConfig.moe exports as Qwen3_5Moe")
    return text_config_from(cfg, torch_dtype=torch_dtype)


def text_config_from(cfg: ModelConfig, *, torch_dtype: str | None = None) -> dict[str, Any]:
    """The config.json keys Qwen3.5 and Qwen3.5-MoE share (qwen35_config_from's, FFN aside)."""
    check_exportable(cfg)
    return {
        "architectures": [QWEN35],
        "model_type": QWEN35_TYPE,
        **shape_fields(cfg),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
        },
        "layer_types": [OUR_KIND[kind] for kind, _ in cfg.layer_slots()],
        **{key: getattr(cfg.kinds.gdn, name) for name, key in GDN_CONFIG_KEYS.items()},
        "max_position_embeddings": 32_768,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "use_cache": True,
        "dtype": torch_dtype or cfg.param_dtype,
    }


def check_exportable(cfg: ModelConfig) -> None:
    """ValueError unless transformers' Qwen3.5 computes exactly cfg's function."""
    if cfg.architecture not in own_arms():
        raise ValueError(
            f"only single-stream arms export to Qwen3.5 (got {cfg.architecture!r}): "
            "transformers has no Orthros output stream"
        )
    need = {
        "qk_norm": True,
        "attn_output_gate": True,
        "norm_zero_centered": True,
        "rope_type": "default",
    }
    wrong = {k: getattr(cfg, k) for k, v in need.items() if getattr(cfg, k) != v}
    if wrong:
        raise ValueError(f"a Qwen3.5 export needs {need}; this config has {wrong}")
