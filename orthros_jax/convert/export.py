"""Export params to a Hugging Face directory that `transformers` loads.

Writes config.json (LlamaForCausalLM, or Qwen3ForCausalLM when cfg.qk_norm; Qwen3_5ForCausalLM
for the gdn / hybrid arms and for a transformer with Qwen3.5's output gate; with MoE layers
(ModelConfig.moe) Qwen3_5MoeForCausalLM for those (convert/qwen35_moe.py) and
Qwen3MoeForCausalLM for a transformer without the gate (convert/qwen3_moe.py); fla's for a pure
gla / retnet / gdn stack; the trust_remote_code OrthrosForCausalLM of remote.py for orthros /
swa / orthros_h), each layer kind's form in it from its declaration (kind.Export), the weights
as safetensors (sharded with an index above max_shard_bytes) and, when given, tokenizer.json.
Needs neither torch nor transformers.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.convert.common import (  # noqa: F401 (check_params, expected_param_shapes: API)
    check_format,
    check_params,
    clear_weights,
    copy_tokenizer,
    default_format,
    expected_param_shapes,
    fits,
)
from orthros_jax.convert.fla import fla_from_params
from orthros_jax.convert.fla_config import fla_config_from
from orthros_jax.convert.hf_config import CONFIG_JSON, hf_config_from
from orthros_jax.convert.hf_weights import hf_from_params, write_safetensors
from orthros_jax.convert.mamba2_hf import MAMBA2, mamba2_config_from, mamba2_from_params
from orthros_jax.convert.qwen3_moe import qwen3_moe_config_from, qwen3_moe_from_params
from orthros_jax.convert.qwen35 import qwen35_from_params
from orthros_jax.convert.qwen35_config import qwen35_config_from
from orthros_jax.convert.qwen35_moe import qwen35_moe_config_from, qwen35_moe_from_params
from orthros_jax.layers import lora
from orthros_jax.layers.kind import FLA, FORMATS, HF, REMOTE
from orthros_jax.layers.registry import kinds_of
from orthros_jax.layers.stack import drop_draft_so

Params = dict[str, Any]
_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# Kinds whose transformers form is a whole model class (their Export.hf), not a layer type.
WHOLE_MODELS = {MAMBA2: (mamba2_config_from, mamba2_from_params)}


def export_hf(
    directory: str,
    cfg: ModelConfig,
    params: Params,
    *,
    tokenizer_file: str | None = None,
    dtype: str | None = None,
    max_shard_bytes: int | None = 5 * 2**30,
    max_position: int | None = None,
    remote: bool | None = None,
    fmt: str | None = None,
    source: str | None = None,
    peft_adapter: bool = False,
) -> list[str]:
    """Writes a HF model directory that `transformers` loads; returns the files written.

    transformer / gdn / hybrid: transformers' own Llama / Qwen3 / Qwen3.5 classes; orthros,
    swa, orthros_h (or any arm with remote=True): the trust_remote_code format of remote.py.
    dtype: 'float32' | 'bfloat16' | 'float16' for the written tensors (default
    cfg.param_dtype). max_shard_bytes: shard above this size (None: one file). max_position:
    the context the model was trained on or imported with (config.json's
    max_position_embeddings). fmt: "hf", "fla" (flash-linear-attention's) or "remote"
    (trust_remote_code; remote=True says the same); None: `default_format(cfg, source)`, source
    being the format the model was imported from (checkpoint.LoadedModel.source_format). A
    format some layer kind has no form in is refused (check_format) before anything is written.
    A model with LoRA adapters (cfg.lora) is written merged (W + (alpha / r) A @ B); with
    peft_adapter=True the base weights are written instead, and the adapters next to them in
    peft's format (convert/peft.py: PeftModel.from_pretrained(base, directory)). Draft
    scale-offsets (cfg.draft_scale_offset) are dropped: no format has them, and the model's
    function does not read them (only a speculative draft does).
    """
    if cfg.lora is not None:
        if peft_adapter:
            from orthros_jax.convert.peft import export_peft

            base, _ = lora.split(params, cfg)
            plain = cfg.replace(lora=None)
            kw: dict[str, Any] = dict(
                tokenizer_file=tokenizer_file, dtype=dtype, max_shard_bytes=max_shard_bytes
            )
            files = export_hf(
                directory, plain, base, max_position=max_position, fmt=fmt, source=source, **kw
            )  # first: it clears the directory's safetensors
            return files + export_peft(directory, cfg, jax.device_get(params))
        params, cfg = lora.merge(params, cfg)
    elif peft_adapter:
        raise ValueError("peft_adapter=True: the model has no LoRA adapters (model.lora is None)")
    if cfg.draft_scale_offset:  # only the speculative draft reads them: the model is the same
        params, cfg = drop_draft_so(params, cfg)
    if dtype is not None and dtype not in _DTYPE_NAMES:
        raise ValueError(f"export dtype {dtype!r} is unknown; allowed: {', '.join(_DTYPE_NAMES)}")
    if fmt not in (None, *FORMATS):
        raise ValueError(f"export fmt {fmt!r} is unknown; allowed: {', '.join(FORMATS)}")
    # A plain export (no format asked, none imported) that only trust_remote_code can hold
    # (e.g. a transformer arm with a shared expert: no Qwen3-MoE field for it) writes it
    # instead of failing.
    fallback = fmt is None and remote is None and not source
    if remote:
        fmt = REMOTE
    elif fmt is None:  # remote=False asks for transformers' own classes
        fmt = HF if remote is False else default_format(cfg, source)
    check_format(cfg, fmt)
    fla = fmt == FLA

    def as_remote() -> list[str]:
        from orthros_jax.convert.remote import export_remote

        return export_remote(
            directory,
            cfg,
            params,
            tokenizer_file=tokenizer_file,
            dtype=dtype,
            max_shard_bytes=max_shard_bytes,
            max_position=max_position,
        )

    if fmt == REMOTE:
        return as_remote()
    # Qwen3.5 for the linear-attention layers and attention with Qwen3.5's output gate.
    qwen35 = any(k.export.hf != "full_attention" for k in kinds_of(cfg)) or cfg.attn_output_gate
    # Both reject two-stream arms (transformers has no output stream).
    make_config, make_tensors = (
        (qwen35_config_from, qwen35_from_params) if qwen35 else (hf_config_from, hf_from_params)
    )
    if cfg.moe is not None:  # MoE layers: Qwen3_5MoeForCausalLM, or a Qwen3MoeForCausalLM
        make_config, make_tensors = (
            (qwen35_moe_config_from, qwen35_moe_from_params)
            if qwen35
            else (qwen3_moe_config_from, qwen3_moe_from_params)
        )
    whole = [k.export.hf for k in kinds_of(cfg) if k.export.hf in WHOLE_MODELS]
    if fla:
        make_config, make_tensors = fla_config_from, fla_from_params
    elif whole:  # e.g. Mamba2ForCausalLM (which refuses anything but a pure stack of its kind)
        make_config, make_tensors = WHOLE_MODELS[whole[0]]
    try:
        hf_config = make_config(cfg, torch_dtype=dtype or cfg.param_dtype)
    except ValueError as e:  # name the formats that may fit
        other = [f for f in FORMATS if f != fmt and fits(cfg, f)]
        # Fall back only when remote code is the one form left; a model another library holds
        # (e.g. fla) is named, not silently written as remote code.
        if fallback and other == [REMOTE]:
            logging.info("export: %s; writing trust_remote_code instead", e)
            return as_remote()
        hint = "; ".join(f"--export_format={f}" for f in other)
        raise ValueError(f"{e}{f' (try {hint})' if hint else ''}") from None
    if max_position:
        hf_config["max_position_embeddings"] = int(max_position)
    check_params(params, cfg)
    host = jax.tree.map(np.asarray, jax.device_get(params))
    tensors = make_tensors(host, cfg, None if dtype is None else jnp.dtype(dtype))
    clear_weights(directory)
    files = write_safetensors(directory, tensors, max_shard_bytes)
    with open(os.path.join(directory, CONFIG_JSON), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    files.append(CONFIG_JSON)
    return files + copy_tokenizer(directory, tokenizer_file)
