"""Export single-stream params to a Hugging Face directory that `transformers` loads.

Writes config.json (LlamaForCausalLM, or Qwen3ForCausalLM when cfg.qk_norm; Qwen3_5ForCausalLM
for the gdn / hybrid arms and for a transformer with Qwen3.5's output gate), the weights as
safetensors (sharded with an index above max_shard_bytes) and, when given, tokenizer.json.
Needs neither torch nor transformers.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.convert.fla import fla_config_from, fla_from_params
from orthros_jax.convert.hf_config import CONFIG_JSON, hf_config_from
from orthros_jax.convert.hf_weights import hf_from_params, write_safetensors
from orthros_jax.convert.qwen35 import qwen35_config_from, qwen35_from_params

Params = dict[str, Any]
TOKENIZER_JSON = "tokenizer.json"
_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def expected_param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{'/'-joined path: shape} of OrthrosLM(cfg)'s params, from an abstract init (no FLOPs)."""
    from orthros_jax.model import init_params

    abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    flat = jax.tree_util.tree_flatten_with_path(abstract)[0]
    return {"/".join(str(k.key) for k in path): tuple(x.shape) for path, x in flat}


def check_params(params: Params, cfg: ModelConfig) -> None:
    """Raises ValueError naming missing/unexpected parameters or a shape mismatch vs cfg."""
    expected = expected_param_shapes(cfg)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    found = {"/".join(str(k.key) for k in path): tuple(np.shape(x)) for path, x in flat}
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or extra:
        raise ValueError(
            f"params do not match a {cfg.architecture} model of this config: "
            f"missing {missing}, unexpected {extra}"
        )
    for name, shape in expected.items():
        if found[name] != shape:
            raise ValueError(
                f"param {name!r} has shape {list(found[name])}; expected {list(shape)}"
            )


def export_hf(
    directory: str,
    cfg: ModelConfig,
    params: Params,
    *,
    tokenizer_file: str | None = None,
    dtype: str | None = None,
    max_shard_bytes: int | None = 5 * 2**30,
    fmt: str | None = None,
) -> list[str]:
    """Writes a HF model directory for a single-stream model; returns the files written.

    dtype: 'float32' | 'bfloat16' | 'float16' for the written tensors (default
    cfg.param_dtype). max_shard_bytes: shard above this size (None: one file). fmt: "fla" for
    flash-linear-attention's format (the default for the gla / retnet arms; gdn takes either).
    """
    qwen35 = cfg.architecture in ("gdn", "hybrid") or cfg.attn_output_gate
    # Both reject two-stream arms (transformers has no output stream).
    make_config, make_tensors = (
        (qwen35_config_from, qwen35_from_params) if qwen35 else (hf_config_from, hf_from_params)
    )
    if fmt not in (None, "hf", "fla"):
        raise ValueError(f"export fmt {fmt!r} is unknown; allowed: hf, fla")
    if fmt == "fla" or (fmt is None and cfg.architecture in ("gla", "retnet")):
        make_config, make_tensors = fla_config_from, fla_from_params
    hf_config = make_config(cfg, torch_dtype=dtype or cfg.param_dtype)
    if dtype is not None and dtype not in _DTYPE_NAMES:
        raise ValueError(f"export dtype {dtype!r} is unknown; allowed: {', '.join(_DTYPE_NAMES)}")
    check_params(params, cfg)
    host = jax.tree.map(np.asarray, jax.device_get(params))
    tensors = make_tensors(host, cfg, None if dtype is None else jnp.dtype(dtype))
    os.makedirs(directory, exist_ok=True)
    # A previous export's shards would otherwise shadow or mix with the new ones.
    for name in os.listdir(directory):
        if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
            os.remove(os.path.join(directory, name))
    files = write_safetensors(directory, tensors, max_shard_bytes)
    with open(os.path.join(directory, CONFIG_JSON), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    files.append(CONFIG_JSON)
    if tokenizer_file:
        dest = os.path.join(directory, TOKENIZER_JSON)
        if os.path.abspath(tokenizer_file) != os.path.abspath(dest):
            shutil.copyfile(tokenizer_file, dest)
        files.append(TOKENIZER_JSON)
    return files
