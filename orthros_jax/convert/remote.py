"""Export any arm as a `transformers` trust_remote_code directory, and read one back.

    files = export_remote(out_dir, cfg, params, tokenizer_file=..., max_position=...)
    model = AutoModelForCausalLM.from_pretrained(out_dir, trust_remote_code=True)
    cfg, params = load_remote(out_dir)          # the inverse (e.g. after save_pretrained)

The directory holds config.json (model_type "orthros", `auto_map` naming the two files below),
configuration_orthros.py and modeling_orthros.py with the modules it imports (REMOTE_FILES:
package data of orthros_jax.convert.hf_remote, the PyTorch model of the paper's equations), the
weights as safetensors and, when given, tokenizer.json. Tensor names follow transformers'
Llama / Qwen3.5 ones (model.layers.{i}.self_attn.q_proj.weight, ...linear_attn.in_proj_qkv.weight,
...) plus the scale-offsets (self_attn.so_{base,out}_{scale,offset} [N, H],
linear_attn.so_out_{scale,offset} [Hk, dk]) and the attention output gate
(self_attn.g_proj.weight); with ModelConfig.moe, the FFNs' as remote_moe.py says (Qwen3-MoE /
Qwen3.5-MoE names: mlp.gate.weight, mlp.experts.gate_up_proj, ...). Needs neither torch nor
transformers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.convert.common import (
    check_format,
    check_params,
    clear_weights,
    config_with,
    copy_tokenizer,
)
from orthros_jax.convert.gdn_hf import GDN_CONFIG_KEYS, gdn_to_hf, hf_to_gdn
from orthros_jax.convert.gdn_hf import HF_NAMES as GDN_HF_NAMES
from orthros_jax.convert.hf_config import CONFIG_JSON, read_hf_config
from orthros_jax.convert.hf_weights import SafetensorsCheckpoint, write_safetensors
from orthros_jax.convert.qwen35 import _BLOCK  # the shared block's HF names (norms, MLP)
from orthros_jax.convert.remote_moe import ffn_from_hf, ffn_to_hf, moe_config, moe_fields
from orthros_jax.layers.kind import REMOTE, LayerKind
from orthros_jax.layers.registry import KINDS

REMOTE_DIR = os.path.join(os.path.dirname(__file__), "hf_remote")
REMOTE_FILES = (
    "configuration_orthros.py",
    "modeling_orthros.py",
    "gdn_orthros.py",
    "moe_orthros.py",
)
MODEL_TYPE, HF_CLASS = "orthros", "OrthrosForCausalLM"
AUTO_MAP = {
    "AutoConfig": "configuration_orthros.OrthrosConfig",
    "AutoModelForCausalLM": "modeling_orthros.OrthrosForCausalLM",
}
# ModelConfig field -> config.json key (the rest keep their names).
_RENAMED = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "d_ff": "intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "norm_eps": "rms_norm_eps",
    "tie_embeddings": "tie_word_embeddings",
    "init_std": "initializer_range",
}
_SAME = (
    "architecture",
    "window",
    "scale_offset",
    "rope_theta",
    "rope_type",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_max_position",
    "partial_rotary_factor",
    "qk_norm",
    "attn_output_gate",
    "norm_zero_centered",
)
_ATTN = {
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "wq_gate": "self_attn.g_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    **{
        f"so_{s}_{a}": f"self_attn.so_{s}_{a}" for s in ("base", "out") for a in ("scale", "offset")
    },
}
_GDN_SO = {
    "gdn_so_out_scale": "linear_attn.so_out_scale",
    "gdn_so_out_offset": "linear_attn.so_out_offset",
}


@dataclasses.dataclass(frozen=True)
class LayerCodec:
    """One layer type of modeling_orthros.py (a kind's Export.remote names it): `names`, our
    per-layer parameter -> its tensor under model.layers.{i}. (the shared block's come from
    _BLOCK); `options`, the kind's option -> its config.json key; the rest of the kind's
    parameters (a mixer whose tensors are fused) go through to_hf / from_hf, tensors
    {prefix}{hf_names}."""

    names: Mapping[str, str]
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    prefix: str = ""
    hf_names: tuple[str, ...] = ()
    to_hf: Callable[[Params, ModelConfig], dict[str, np.ndarray]] | None = None
    from_hf: Callable[[Mapping[str, np.ndarray], ModelConfig], Params] | None = None


CODECS = {
    "full_attention": LayerCodec(_ATTN),
    "linear_attention": LayerCodec(
        _GDN_SO, GDN_CONFIG_KEYS, "linear_attn.", GDN_HF_NAMES, gdn_to_hf, hf_to_gdn
    ),
}


def _codec(kind: LayerKind) -> LayerCodec:
    if kind.export.remote not in CODECS:
        raise ValueError(f"layer kind {kind.name!r} has no trust_remote_code form")
    return CODECS[kind.export.remote]


def _remote_kinds() -> list[LayerKind]:
    return [k for k in KINDS.values() if k.export.remote in CODECS]


# Projections whose first axis is the input (D or F): torch Linear stores [out, in].
_IN_MAJOR = ("wq", "wk", "wv", "wq_gate", "w_gate", "w_up", "w_down")
Params = dict[str, Any]


def remote_config(
    cfg: ModelConfig, *, torch_dtype: str | None = None, max_position: int | None = None
) -> dict[str, Any]:
    """config.json of cfg for modeling_orthros (max_position: the context the model was trained
    on or imported with; default 2048 when unknown)."""
    check_format(cfg, REMOTE)
    hf: dict[str, Any] = {
        "architectures": [HF_CLASS],
        "model_type": MODEL_TYPE,
        "auto_map": dict(AUTO_MAP),
    }
    hf.update({key: getattr(cfg, name) for name, key in _RENAMED.items()})
    hf.update({name: getattr(cfg, name) for name in _SAME})
    for kind in _remote_kinds():  # every kind's options (the config class has them all)
        hf.update(
            {key: getattr(cfg.kinds[kind.name], n) for n, key in _codec(kind).options.items()}
        )
    hf["layer_types"] = [KINDS[kind].export.remote for kind, _ in cfg.layer_slots()]
    hf.update(moe_config(cfg))
    hf["max_position_embeddings"] = int(max_position or 2048)
    hf["torch_dtype"] = torch_dtype or cfg.param_dtype
    hf["use_cache"] = True
    return hf


def config_from_remote(hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """The ModelConfig of a remote-code config.json dict (inverse of remote_config)."""
    if hf.get("model_type") != MODEL_TYPE:
        raise ValueError(f"config.json model_type {hf.get('model_type')!r} is not {MODEL_TYPE!r}")
    fields = {name: hf[key] for name, key in _RENAMED.items() if key in hf}
    fields.update({name: hf[name] for name in _SAME if name in hf})
    fields["kinds"] = {  # the option sections (a kind without options, e.g. attention, has none)
        k.name: {n: hf[key] for n, key in _codec(k).options.items() if key in hf}
        for k in _remote_kinds()
        if _codec(k).options
    }
    ours = {k.export.remote: k.name for k in _remote_kinds() if k.export.remote is not None}
    unknown = sorted(set(hf["layer_types"]) - set(ours))
    if unknown:
        raise ValueError(f"config.json layer_types {unknown} are unknown; known: {sorted(ours)}")
    kinds = [ours[t] for t in hf["layer_types"]]
    cycle = next(
        kinds[:p]
        for p in range(1, len(kinds) + 1)
        if len(kinds) % p == 0 and kinds == kinds[:p] * (len(kinds) // p)
    )
    fields["layer_types"] = tuple(cycle)
    fields.update(moe_fields(hf))
    return config_with(fields, overrides)


def _to_hf(name: str, a: np.ndarray) -> np.ndarray:
    if name in _IN_MAJOR:
        return a.reshape(a.shape[0], -1).T
    if name == "wo":
        return a.reshape(-1, a.shape[-1]).T
    return a


def _to_ours(name: str, a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return (a.T if name in _IN_MAJOR or name == "wo" else a).reshape(shape)


def _layer_names(kind: LayerKind, shapes: Mapping[str, Any]) -> dict[str, str]:
    """our per-layer name -> HF name under model.layers.{i}. (a codec's to_hf ones excluded)."""
    table = {**_BLOCK, **_codec(kind).names}
    return {name: table[name] for name in shapes if name in table}


def remote_from_params(
    params: Params, cfg: ModelConfig, dtype: Any = None
) -> dict[str, np.ndarray]:
    """HF-named tensors (numpy) of any arm's params."""
    check_format(cfg, REMOTE)
    cast = (
        (lambda a: np.ascontiguousarray(a))
        if dtype is None
        else (lambda a: np.ascontiguousarray(a).astype(np.dtype(dtype)))
    )
    out = {"model.embed_tokens.weight": cast(np.asarray(params["embedding"]))}
    for i, (kind, li) in enumerate(cfg.layer_slots()):
        k = KINDS[kind]
        p = {name: np.asarray(a[li]) for name, a in params[k.params_key].items()}
        pre = f"model.layers.{i}."
        names = _layer_names(k, k.params(cfg))
        for name, hf_name in names.items():
            out[pre + hf_name] = cast(_to_hf(name, p[name]))
        codec = _codec(k)
        if codec.to_hf is not None:
            mixer = {n: v for n, v in p.items() if n not in names}
            for name, value in codec.to_hf(mixer, cfg).items():
                out[f"{pre}{codec.prefix}{name}"] = cast(value)
    out.update({name: cast(a) for name, a in ffn_to_hf(params, cfg).items()})
    out["model.norm.weight"] = cast(np.asarray(params["final_norm"]))
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = cast(np.asarray(params["lm_head"]).T)
    return out


def params_from_remote(tensors: Mapping[str, Any], cfg: ModelConfig) -> Params:
    """Params (numpy, cfg.param_dtype) from HF-named tensors; inverse of remote_from_params.
    ValueError naming a missing tensor or a shape that does not fit cfg."""
    check_format(cfg, REMOTE)
    dtype = np.dtype(cfg.param_dtype)

    def get(name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"remote checkpoint lacks tensor {name!r} for this config")
        a = np.asarray(tensors[name], np.float32)
        if shape is not None and a.size != int(np.prod(shape)):
            raise ValueError(f"tensor {name!r} has shape {list(a.shape)}; expected {shape}")
        return a

    d, v = cfg.d_model, cfg.vocab_size
    params: Params = {"embedding": get("model.embed_tokens.weight", (v, d)).astype(dtype)}
    for i, (kind, li) in enumerate(cfg.layer_slots()):
        k = KINDS[kind]
        shapes = {n: d.shape for n, d in k.params(cfg).items()}
        stack = params.setdefault(k.params_key, {})
        pre = f"model.layers.{i}."
        values = {
            name: _to_ours(name, get(pre + hf, shapes[name]), shapes[name])
            for name, hf in _layer_names(k, shapes).items()
        }
        codec = _codec(k)
        if codec.from_hf is not None:
            sub = {n: get(f"{pre}{codec.prefix}{n}") for n in codec.hf_names}
            values.update(codec.from_hf(sub, cfg))
        for name, value in values.items():
            if name not in stack:
                stack[name] = np.empty((cfg.layers_of(kind), *shapes[name]), dtype)
            stack[name][li] = value
    params.update(ffn_from_hf(get, cfg))
    params["final_norm"] = get("model.norm.weight", (d,)).astype(dtype)
    if not cfg.tie_embeddings:
        params["lm_head"] = get("lm_head.weight", (v, d)).T.astype(dtype)
    return params


def export_remote(
    directory: str,
    cfg: ModelConfig,
    params: Params,
    *,
    tokenizer_file: str | None = None,
    dtype: str | None = None,
    max_shard_bytes: int | None = 5 * 2**30,
    max_position: int | None = None,
) -> list[str]:
    """Writes a trust_remote_code HF directory for any arm whose kinds have a remote form;
    returns the files written."""
    check_format(cfg, REMOTE)
    check_params(params, cfg)
    hf = remote_config(cfg, torch_dtype=dtype or cfg.param_dtype, max_position=max_position)
    tensors = remote_from_params(params, cfg, dtype)
    clear_weights(directory)
    files = write_safetensors(directory, tensors, max_shard_bytes)
    with open(os.path.join(directory, CONFIG_JSON), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
    files.append(CONFIG_JSON)
    for name in REMOTE_FILES:
        shutil.copyfile(os.path.join(REMOTE_DIR, name), os.path.join(directory, name))
        files.append(name)
    return files + copy_tokenizer(directory, tokenizer_file)


def is_remote(hf: Mapping[str, Any]) -> bool:
    """Whether a config.json dict is an orthros remote-code export."""
    return hf.get("model_type") == MODEL_TYPE


def load_remote(hf_dir: str, **overrides: Any) -> tuple[ModelConfig, Params]:
    """(cfg, params) of a remote-code directory (ours, or re-saved by save_pretrained)."""
    cfg = config_from_remote(read_hf_config(hf_dir), **overrides)
    return cfg, params_from_remote(SafetensorsCheckpoint(hf_dir), cfg)
