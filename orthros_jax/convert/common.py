"""What every exporter (export.py's native formats, remote.py's trust_remote_code one) shares:
the params check against the config, and the directory's weights and tokenizer files."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax
import numpy as np

from orthros_jax.config import ModelConfig

Params = dict[str, Any]
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"


def config_with(fields: dict[str, Any], overrides: dict[str, Any]) -> ModelConfig:
    """ModelConfig(**fields) with `overrides` (ModelConfig fields; kinds= changes only the
    options it names, e.g. kinds={"gdn": {"chunk": 16}})."""
    return ModelConfig(**fields).replace(**overrides)


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
