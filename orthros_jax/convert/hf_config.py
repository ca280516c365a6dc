"""Hugging Face config.json <-> ModelConfig for Llama and Qwen3 (dense) checkpoints.

Both the legacy layout (top-level `rope_theta` + `rope_scaling`, transformers 4.x) and the
transformers 5 layout (`rope_parameters` holding `rope_theta` and `rope_type`) are read.
Export writes the legacy layout, which transformers 4.x and 5.x both load.

Anything this codebase cannot reproduce exactly (biases, MoE, sliding-window layers, rope
scalings other than default/llama3, non-SiLU MLPs) is rejected with a ValueError that says what
was found and what is supported, before any tensor is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from orthros_jax.config import ModelConfig
from orthros_jax.config.architectures import TWO_STREAM_FORM
from orthros_jax.convert.common import own_arm
from orthros_jax.layers import attention

CONFIG_JSON = "config.json"
LLAMA, QWEN3 = "LlamaForCausalLM", "Qwen3ForCausalLM"
SUPPORTED_ARCHITECTURES: tuple[str, ...] = (LLAMA, QWEN3)
MODEL_TYPES: dict[str, str] = {"llama": LLAMA, "qwen3": QWEN3}
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "llama3")
# Keys whose presence means a mixture-of-experts model (Mixtral, Qwen3-MoE, DeepSeek, ...).
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
)


def read_hf_config(hf_dir: str) -> dict[str, Any]:
    """The parsed config.json of a Hugging Face model directory."""
    path = os.path.join(hf_dir, CONFIG_JSON)
    if not os.path.isfile(path):
        raise ValueError(
            f"{hf_dir!r} has no {CONFIG_JSON}: expected a Hugging Face model directory "
            "(config.json + *.safetensors), e.g. one written by save_pretrained"
        )
    with open(path) as f:
        return json.load(f)


def hf_architecture(hf: Mapping[str, Any]) -> str:
    """The supported architecture name of a config, or a ValueError naming what was found."""
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    moe = [k for k in _MOE_KEYS if hf.get(k)]
    if moe:
        found = archs[0] if archs else f"model_type={model_type!r}"
        raise ValueError(
            f"unsupported architecture {found}: "
            f"a mixture-of-experts config ({', '.join(moe)} set); "
            f"supported: {supported} (dense)"
        )
    if archs:
        if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture(s) {archs}; supported: {supported}")
        arch = archs[0]
    elif model_type in MODEL_TYPES:
        arch = MODEL_TYPES[model_type]
    else:
        raise ValueError(
            f"unsupported model_type {model_type!r} (config.json has no 'architectures'); "
            f"supported: {supported} (model_type {', '.join(MODEL_TYPES)})"
        )
    if model_type is not None and MODEL_TYPES.get(model_type) != arch:
        raise ValueError(
            f"config.json says architecture {arch} but model_type {model_type!r}; expected "
            f"model_type {next(k for k, v in MODEL_TYPES.items() if v == arch)!r}"
        )
    return arch


def _rope(hf: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig rope fields from either rope layout; rejects unsupported scalings."""
    params = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling")
    if legacy:
        params = {**params, **legacy}
    theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope scaling {rope_type!r} (rope parameters {params}); "
            f"supported rope types: {', '.join(SUPPORTED_ROPE_TYPES)} (or none)"
        )
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"unsupported partial_rotary_factor={partial}; expected 1.0 (full RoPE)")
    out: dict[str, Any] = {"rope_theta": float(theta), "rope_type": rope_type}
    if rope_type == "llama3":
        needed = (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        )
        missing = [k for k in needed if k not in params]
        if missing:
            raise ValueError(f"llama3 rope scaling {params} lacks {missing}; expected {needed}")
        out.update(
            rope_factor=float(params["factor"]),
            rope_low_freq_factor=float(params["low_freq_factor"]),
            rope_high_freq_factor=float(params["high_freq_factor"]),
            rope_original_max_position=int(params["original_max_position_embeddings"]),
        )
    return out


def _check_supported(hf: Mapping[str, Any], arch: str) -> None:
    """Rejects config features the Llama-style block here does not implement."""
    missing = [k for k in _REQUIRED if k not in hf]
    if missing:
        raise ValueError(f"{arch} config.json lacks required field(s) {missing}")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise ValueError(
                f"unsupported {key}=True: bias terms are not implemented; expected {key}=False"
            )
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act={act!r}; expected 'silu' (SwiGLU MLP)")
    if hf.get("use_sliding_window"):
        raise ValueError(
            "unsupported use_sliding_window=True (Qwen sliding-window layers); expected False"
        )
    layer_types = set(hf.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(
            f"unsupported layer_types {sorted(layer_types)}; expected only 'full_attention'"
        )
    if hf.get("pretraining_tp", 1) != 1:
        raise ValueError(f"unsupported pretraining_tp={hf['pretraining_tp']}; expected 1")


def config_from_hf(
    hf: Mapping[str, Any],
    *,
    architecture: str | None = None,
    window: int = 128,
    **overrides: Any,
) -> ModelConfig:
    """ModelConfig for a Hugging Face Llama/Qwen3 config.json dict.

    architecture None (the attention-only own arm, 'transformer') reproduces the checkpoint;
    its two-stream form ('orthros') gives the config of the converted model (identity SO, see
    convert.orthros.from_transformer). overrides set other ModelConfig fields (dtype,
    param_dtype, prefill_chunk, ...).
    """
    own = own_arm(attention.KIND.name)
    architecture = architecture or own
    arch = hf_architecture(hf)
    _check_supported(hf, arch)
    n_heads = int(hf["num_attention_heads"])
    # Qwen3Config defaults head_dim to 128; Llama derives it from hidden_size.
    default_head_dim = 128 if arch == QWEN3 else int(hf["hidden_size"]) // n_heads
    head_dim = hf.get("head_dim") or default_head_dim
    fields: dict[str, Any] = dict(
        vocab_size=int(hf["vocab_size"]),
        d_model=int(hf["hidden_size"]),
        n_layers=int(hf["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or n_heads),
        head_dim=int(head_dim),
        d_ff=int(hf["intermediate_size"]),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qk_norm=arch == QWEN3,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),  # both classes default False
        window=window,
        architecture=architecture,
        scale_offset=architecture == TWO_STREAM_FORM[own],
        **_rope(hf),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def shape_fields(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json fields of the transformer block's shapes that every exported family
    (Llama, Qwen3, Qwen3.5) writes the same way."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
    }


def hf_config_from(cfg: ModelConfig, *, torch_dtype: str | None = None) -> dict[str, Any]:
    """config.json contents for exporting a transformer-arm model (Qwen3 iff qk_norm).

    torch_dtype: the dtype the tensors are written in (default: cfg.param_dtype).
    """
    own = own_arm(attention.KIND.name)
    if cfg.architecture != own:
        raise ValueError(
            f"only architecture={own!r} exports to Hugging Face (got {cfg.architecture!r}): "
            "transformers has no Orthros/sliding-window-only Llama, so the exported model would "
            "compute a different function"
        )
    arch = QWEN3 if cfg.qk_norm else LLAMA
    rope_scaling = None
    if cfg.rope_type == "llama3":
        rope_scaling = {
            "rope_type": "llama3",
            "factor": cfg.rope_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_position,
        }
    hf: dict[str, Any] = {
        "architectures": [arch],
        "model_type": "qwen3" if cfg.qk_norm else "llama",
        **shape_fields(cfg),
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling,
        # HF warns when original_max_position_embeddings >= max_position_embeddings.
        "max_position_embeddings": max(32_768, 2 * cfg.rope_original_max_position),
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "use_cache": True,
        "torch_dtype": torch_dtype or cfg.param_dtype,
    }
    if arch == LLAMA:
        hf["mlp_bias"] = False
    else:
        hf["use_sliding_window"] = False
        hf["sliding_window"] = None
    return hf
