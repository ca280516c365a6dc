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
from orthros_jax.config.architectures import ARCHITECTURES
from orthros_jax.layers.kind import FLA, HF, REMOTE
from orthros_jax.layers.registry import kinds_of

Params = dict[str, Any]
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"


def config_with(fields: dict[str, Any], overrides: dict[str, Any]) -> ModelConfig:
    """ModelConfig(**fields) with `overrides` (ModelConfig fields; kinds= changes only the
    options it names, e.g. kinds={"gdn": {"chunk": 16}})."""
    return ModelConfig(**fields).replace(**overrides)


def own_arms() -> dict[frozenset[str], str]:
    """The arm a checkpoint of one stream and no window imports as, by the set of kinds of its
    layers: the architectures of the arms table with one stream and no base window (one per
    kind set: attention alone, GDN with attention, each pure stack)."""
    return {
        a.kinds: name for name, a in ARCHITECTURES.items() if not (a.two_streams or a.base_window)
    }


def own_arm(*kinds: str) -> str:
    """The arm of own_arms() made of exactly `kinds` (layer kind names)."""
    return own_arms()[frozenset(kinds)]


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


def default_format(cfg: ModelConfig, source: str | None = None) -> str:
    """The format a plain export writes: the one the model was imported from (`source`), else
    transformers' own classes when the arm is single-stream without a window and every kind
    has a transformers layer (transformer, gdn, hybrid), else fla's for a single-stream pure
    stack of a kind fla has (gla, retnet), else trust_remote_code."""
    if source:
        return source
    kinds = kinds_of(cfg)
    plain = not cfg.two_streams and cfg.base_window is None
    if plain and all(k.export.hf for k in kinds):
        return HF
    if plain and len(kinds) == 1 and kinds[0].export.fla:
        return FLA
    return REMOTE


def check_format(cfg: ModelConfig, fmt: str) -> None:
    """A one-line ValueError unless every layer kind of cfg has a form in `fmt` (fla: also a
    single-stream pure stack; MoE layers: hf or remote), naming the kind, why, and the formats it
    has."""
    for kind in kinds_of(cfg):
        if kind.export.name(fmt) is None:
            has = ", ".join(f"--export_format={f}" for f in kind.export.formats()) or "none"
            why = f" ({kind.export.note})" if kind.export.note else ""
            raise ValueError(
                f"cannot export this {cfg.architecture} model (layer_types {cfg.layer_types}) "
                f"as {fmt}: its {kind.name!r} layers have no {fmt} form{why}; formats of "
                f"{kind.name!r}: {has}"
            )
    if fmt == FLA and (len(kinds_of(cfg)) > 1 or cfg.two_streams or cfg.base_window):
        raise ValueError(
            f"cannot export this {cfg.architecture} model (layer_types {cfg.layer_types}) as "
            "fla: fla's models are single-stream pure stacks of one kind"
        )
    if cfg.moe is not None and fmt not in (HF, REMOTE):
        raise ValueError(
            f"cannot export this {cfg.architecture} model with MoE layers (ModelConfig.moe) as "
            f"{fmt}: only trust_remote_code (--export_format={REMOTE}, any arm) and transformers' "
            f"Qwen3-MoE / Qwen3.5-MoE (--export_format={HF}, single-stream arms) have a MoE FFN"
        )


def fits(cfg: ModelConfig, fmt: str) -> bool:
    """Whether cfg exports to fmt (check_format passes)."""
    try:
        check_format(cfg, fmt)
    except ValueError:
        return False
    return True
