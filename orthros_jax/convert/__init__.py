"""Hugging Face Llama/Qwen3 import and export, and Transformer -> Orthros conversion.

    cfg, params = load_hf(hf_dir)                       # transformer arm, numpy params
    ocfg, oparams = from_transformer(params, cfg, window=128)
    export_hf(out_dir, cfg, params, tokenizer_file=hf_tokenizer_file(hf_dir))

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
from typing import Any

from orthros_jax.config import ModelConfig
from orthros_jax.convert.export import check_params, expected_param_shapes, export_hf
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
from orthros_jax.convert.orthros import from_transformer

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "SafetensorsCheckpoint",
    "check_hf_tensors",
    "check_params",
    "config_from_hf",
    "expected_param_shapes",
    "export_hf",
    "from_transformer",
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
    """(cfg, params) of the transformer arm from a HF Llama/Qwen3 directory.

    overrides: extra ModelConfig fields (e.g. param_dtype='bfloat16', window, prefill_chunk);
    architecture stays 'transformer' — convert with `from_transformer`. Config and tensor
    names/shapes are validated before any weight is read.
    """
    if overrides.get("architecture", "transformer") != "transformer":
        raise ValueError("load_hf returns the transformer arm; use from_transformer for Orthros")
    overrides.pop("architecture", None)
    cfg = config_from_hf(read_hf_config(hf_dir), **overrides)
    return cfg, params_from_hf(SafetensorsCheckpoint(hf_dir), cfg)


def hf_tokenizer_file(hf_dir: str) -> str | None:
    """The directory's tokenizer.json, or None when it has none."""
    path = os.path.join(hf_dir, "tokenizer.json")
    return path if os.path.isfile(path) else None
