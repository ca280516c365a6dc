"""Hugging Face Llama/Qwen3/Qwen3-MoE/Qwen3.5/Qwen3.5-MoE and fla (GLA, RetNet, Gated DeltaNet)
import and export, and Transformer -> Orthros conversion.

    cfg, params = load_hf(hf_dir)                       # transformer (Qwen3.5: hybrid), numpy
    ocfg, oparams = from_transformer(params, cfg, window=128)   # orthros (Qwen3.5: orthros_h)
    export_hf(out_dir, cfg, params, tokenizer_file=hf_tokenizer_file(hf_dir))

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
from typing import Any

from orthros_jax.config import ModelConfig
from orthros_jax.convert.common import own_arms
from orthros_jax.convert.export import check_params, expected_param_shapes, export_hf
from orthros_jax.convert.fla import params_from_fla
from orthros_jax.convert.fla_config import config_from_fla, is_fla
from orthros_jax.convert.hf_config import (
    SUPPORTED_ARCHITECTURES,
    config_from_hf,
    hf_config_from,
    read_hf_config,
)
from orthros_jax.convert.hf_weights import (
    SafetensorsCheckpoint,
    check_hf_tensors,
    hf_from_params,
    hf_tensor_shapes,
    params_from_hf,
    write_safetensors,
)
from orthros_jax.convert.mamba2_hf import config_from_mamba2, is_mamba2, params_from_mamba2
from orthros_jax.convert.orthros import from_transformer
from orthros_jax.convert.qwen3_moe import config_from_qwen3_moe, is_qwen3_moe, params_from_qwen3_moe
from orthros_jax.convert.qwen35 import params_from_qwen35
from orthros_jax.convert.qwen35_config import config_from_qwen35, is_qwen35
from orthros_jax.convert.qwen35_moe import (
    config_from_qwen35_moe,
    is_qwen35_moe,
    params_from_qwen35_moe,
)

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "SafetensorsCheckpoint",
    "check_hf_tensors",
    "check_params",
    "config_from_hf",
    "expected_param_shapes",
    "export_hf",
    "config_from_qwen3_moe",
    "config_from_qwen35",
    "config_from_qwen35_moe",
    "from_transformer",
    "is_qwen35",
    "is_qwen35_moe",
    "params_from_qwen35",
    "params_from_qwen35_moe",
    "hf_config_from",
    "hf_from_params",
    "hf_tensor_shapes",
    "hf_tokenizer_file",
    "load_hf",
    "params_from_hf",
    "read_hf_config",
    "write_safetensors",
]


def load_hf(hf_dir: str, **overrides: Any) -> tuple[ModelConfig, dict[str, Any]]:
    """(cfg, params) of the checkpoint's own single-stream arm from a HF Llama/Qwen3 directory
    (transformer; Qwen3-MoE: transformer with ModelConfig.moe), a Qwen3.5 one (hybrid; gdn when
    every layer is linear attention; Qwen3.5-MoE: the same with ModelConfig.moe), a
    transformers Mamba2 one (mamba2, without FFN) or an flash-linear-attention one (model_type
    gla / retnet / gated_deltanet: arms gla / retnet / gdn).

    overrides: extra ModelConfig fields (e.g. param_dtype='bfloat16', window, prefill_chunk);
    the architecture stays the checkpoint's — convert with `from_transformer`. Config and
    tensor names/shapes are validated before any weight is read.
    """
    if overrides.pop("architecture", None) not in (None, *own_arms().values()):
        raise ValueError("load_hf returns the checkpoint's arm; use from_transformer for Orthros")
    hf = read_hf_config(hf_dir)
    if is_fla(hf):
        cfg = config_from_fla(hf, **overrides)
        return cfg, params_from_fla(SafetensorsCheckpoint(hf_dir), cfg)
    if is_mamba2(hf):
        cfg = config_from_mamba2(hf, **overrides)
        return cfg, params_from_mamba2(SafetensorsCheckpoint(hf_dir), cfg)
    if is_qwen3_moe(hf):
        cfg = config_from_qwen3_moe(hf, **overrides)
        return cfg, params_from_qwen3_moe(SafetensorsCheckpoint(hf_dir), cfg)
    if is_qwen35_moe(hf):
        cfg = config_from_qwen35_moe(hf, **overrides)
        return cfg, params_from_qwen35_moe(SafetensorsCheckpoint(hf_dir), cfg)
    if is_qwen35(hf):
        cfg = config_from_qwen35(hf, **overrides)
        return cfg, params_from_qwen35(SafetensorsCheckpoint(hf_dir), cfg)
    cfg = config_from_hf(hf, **overrides)
    return cfg, params_from_hf(SafetensorsCheckpoint(hf_dir), cfg)


def hf_tokenizer_file(hf_dir: str) -> str | None:
    """The directory's tokenizer.json, or None when it has none."""
    path = os.path.join(hf_dir, "tokenizer.json")
    return path if os.path.isfile(path) else None
