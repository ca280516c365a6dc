"""Export params to a Hugging Face directory that `transformers` loads.

Writes config.json (LlamaForCausalLM, or Qwen3ForCausalLM when cfg.qk_norm; Qwen3_5ForCausalLM
for the gdn / hybrid arms and for a transformer with Qwen3.5's output gate; the
trust_remote_code OrthrosForCausalLM of remote.py for orthros / swa / orthros_h), the weights
as safetensors (sharded with an index above max_shard_bytes) and, when given, tokenizer.json.
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
from orthros_jax.convert.hf_config import CONFIG_JSON, hf_config_from
from orthros_jax.convert.hf_weights import hf_from_params, write_safetensors
from orthros_jax.convert.qwen35 import qwen35_config_from, qwen35_from_params

Params = dict[str, Any]
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"
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


def clear_weights(directory: str) -> None:
    """Creates directory and removes a previous export's safetensors (which would otherwise
    shadow or mix with the new ones)."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
            os.remove(os.path.join(directory, name))


def copy_tokenizer(directory: str, tokenizer_file: str | None) -> list[str]:
    """Copies tokenizer.json next to the weights and, unless the directory has one, writes a
    tokenizer_config.json naming its special tokens, so `AutoTokenizer` (and lm-eval's `hf`
    model) load it; returns the files written."""
    if not tokenizer_file:
        return []
    dest = os.path.join(directory, TOKENIZER_JSON)
    if os.path.abspath(tokenizer_file) != os.path.abspath(dest):
        shutil.copyfile(tokenizer_file, dest)
    config_path = os.path.join(directory, TOKENIZER_CONFIG_JSON)
    if os.path.isfile(config_path):
        return [TOKENIZER_JSON]
    with open(config_path, "w") as f:
        json.dump(tokenizer_config(dest), f, indent=2, sort_keys=True)
    return [TOKENIZER_JSON, TOKENIZER_CONFIG_JSON]


def tokenizer_config(tokenizer_file: str) -> dict[str, Any]:
    """transformers' tokenizer_config.json for a bare tokenizer.json: the fast tokenizer class,
    EOS (a common end-of-text name it holds; also the padding token) and BOS (what its
    post-processor prepends), as orthros_jax reads them."""
    from orthros_jax.data.tokenizers import HFTokenizer

    tok = HFTokenizer(tokenizer_file)
    raw = tok._tok
    out: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if tok.eos_id is not None:
        out["eos_token"] = out["pad_token"] = raw.id_to_token(tok.eos_id)
    added = raw.encode("", add_special_tokens=True).ids
    if added:
        out["bos_token"] = raw.id_to_token(added[0])
    return out


# The arms transformers implements itself; the others export as trust_remote_code.
NATIVE_ARMS = ("transformer", "gdn", "hybrid")


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
) -> list[str]:
    """Writes a HF model directory that `transformers` loads; returns the files written.

    transformer / gdn / hybrid: transformers' own Llama / Qwen3 / Qwen3.5 classes; orthros,
    swa, orthros_h (or any arm with remote=True): the trust_remote_code format of remote.py.
    dtype: 'float32' | 'bfloat16' | 'float16' for the written tensors (default
    cfg.param_dtype). max_shard_bytes: shard above this size (None: one file). max_position:
    the context the model was trained on or imported with (config.json's
    max_position_embeddings).
    """
    if dtype is not None and dtype not in _DTYPE_NAMES:
        raise ValueError(f"export dtype {dtype!r} is unknown; allowed: {', '.join(_DTYPE_NAMES)}")
    if remote is None:
        remote = cfg.architecture not in NATIVE_ARMS
    if remote:
        from orthros_jax.convert.remote import export_remote

        return export_remote(
            directory, cfg, params, tokenizer_file=tokenizer_file, dtype=dtype,
            max_shard_bytes=max_shard_bytes, max_position=max_position,
        )  # fmt: skip
    qwen35 = cfg.architecture in ("gdn", "hybrid") or cfg.attn_output_gate
    # Both reject two-stream arms (transformers has no output stream).
    make_config, make_tensors = (
        (qwen35_config_from, qwen35_from_params) if qwen35 else (hf_config_from, hf_from_params)
    )
    hf_config = make_config(cfg, torch_dtype=dtype or cfg.param_dtype)
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
