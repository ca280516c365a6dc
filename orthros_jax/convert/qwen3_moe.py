"""Hugging Face Qwen3-MoE (Qwen3MoeForCausalLM) <-> a transformer arm with MoE layers.

The attention and norms are Qwen3's (hf_config / hf_weights). Layer i is a MoE layer when
i is not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0 (transformers'
Qwen3MoeDecoderLayer), else a dense SwiGLU of intermediate_size; the pattern becomes
ModelConfig.moe.ffn_cycle (its shortest period dividing the layers). Tensors per layer i:
  mlp.gate.weight, mlp.experts.*               -> moe/router, w_gate, w_up, w_down (moe_hf.py:
                                                 per-expert or transformers 5's fused layout)
  mlp.gate_proj / up_proj / down_proj          -> ffn/w_gate, w_up, w_down (dense layers)
Export writes the per-expert layout (what the Hub's checkpoints hold; transformers 4 and 5 load
it). Options the model here does not compute are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.config.moe import MoEOptions
from orthros_jax.convert.hf_config import QWEN3, config_from_hf, hf_config_from
from orthros_jax.convert.hf_weights import _GLOBAL_NAMES, _LAYER_NAMES, _layouts
from orthros_jax.convert.moe_hf import moe_config_keys, moe_from_hf, moe_options_of, moe_to_hf

QWEN3_MOE = "Qwen3MoeForCausalLM"
_MOE_KEYS = (
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "router_aux_loss_coef",
    "output_router_logits",
)
# Options of other MoE families this block does not compute.
_REFUSED = ("shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace")
Params = dict[str, Any]


def is_qwen3_moe(hf: Mapping[str, Any]) -> bool:
    return QWEN3_MOE in (hf.get("architectures") or []) or hf.get("model_type") == "qwen3_moe"


def sparse_pattern(hf: Mapping[str, Any]) -> list[bool]:
    """Which layers are MoE layers, as transformers decides."""
    n_exp = int(hf.get("num_experts") or hf.get("num_local_experts") or 0)
    step = int(hf.get("decoder_sparse_step", 1))
    only = set(hf.get("mlp_only_layers") or [])
    n = int(hf["num_hidden_layers"])
    return [i not in only and n_exp > 0 and (i + 1) % step == 0 for i in range(n)]


def _shortest_period(pattern: list[str]) -> tuple[str, ...]:
    n = len(pattern)
    p = next(p for p in range(1, n + 1) if n % p == 0 and pattern == pattern[:p] * (n // p))
    return tuple(pattern[:p])


def config_from_qwen3_moe(hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """ModelConfig (transformer arm, MoE layers) of a Qwen3-MoE config.json dict; overrides
    as config_from_hf's (a "moe" dict of MoEOptions fields changes those)."""
    refused = [k for k in _REFUSED if hf.get(k)]
    if refused:
        raise ValueError(f"unsupported Qwen3-MoE option(s) {refused}: no shared experts here")
    # hidden_act stays in the dense part, which config_from_hf checks. The MoE's own sizes
    # are required: transformers' defaults (128 experts, top-8) are a 30B model's, not a guess.
    needed = ("num_hidden_layers", "hidden_size", "num_experts_per_tok", "moe_intermediate_size")
    missing = [k for k in needed if k not in hf]
    if missing:
        raise ValueError(f"{QWEN3_MOE} config.json lacks {missing}")
    pattern = sparse_pattern(hf)
    if not any(pattern):
        raise ValueError(
            "Qwen3-MoE config has no MoE layer (num_experts, decoder_sparse_step, "
            "mlp_only_layers); load it as a dense Qwen3"
        )
    dense = {k: v for k, v in hf.items() if k not in _MOE_KEYS}
    dense |= {"architectures": [QWEN3], "model_type": "qwen3"}
    moe = MoEOptions(
        **moe_options_of(hf),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        ffn_cycle=_shortest_period(["moe" if s else "dense" for s in pattern]),
    )
    moe = moe.replace(**dict(overrides.pop("moe", None) or {}))
    return config_from_hf(dense, **overrides, moe=moe)


def qwen3_moe_config_from(cfg: ModelConfig, *, torch_dtype: str | None = None) -> dict[str, Any]:
    """config.json of a transformer arm with MoE layers, as Qwen3MoeForCausalLM."""
    if cfg.moe is None or not cfg.qk_norm or cfg.moe.shared_expert:
        raise ValueError(
            "Qwen3-MoE export needs ModelConfig.moe without a shared expert and qk_norm=True "
            f"(got moe={cfg.moe}, qk_norm={cfg.qk_norm})"
        )
    hf = hf_config_from(cfg.replace(moe=None), torch_dtype=torch_dtype)
    types = _ffn_of_layers(cfg)
    return (
        hf
        | {"architectures": [QWEN3_MOE], "model_type": "qwen3_moe"}
        | moe_config_keys(cfg)
        | {
            "norm_topk_prob": cfg.moe.norm_topk_prob,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [i for i, t in enumerate(types) if t == "dense"],
        }
    )


_DENSE = {
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
_SHARED = ("attn_norm", "wq", "wk", "wv", "wo", "q_norm", "k_norm", "mlp_norm")


def _ffn_of_layers(cfg: ModelConfig) -> tuple[str, ...]:
    """The FFN choice of every layer, in order."""
    assert cfg.moe is not None
    return cfg.moe.ffn_types(cfg.n_layers)


def params_from_qwen3_moe(tensors: Mapping[str, Any], cfg: ModelConfig) -> Params:
    """OrthrosLM params (transformer arm with MoE layers, numpy) from HF-named tensors."""
    dtype = np.dtype(cfg.param_dtype)
    lay = _layouts(cfg.replace(moe=None))
    params: Params = {"layers": {}, "ffn": {}, "moe": {}}
    for key in ("embedding", "final_norm", "lm_head"):
        if key in lay:
            params[key] = np.asarray(lay[key][1](np.asarray(tensors[_GLOBAL_NAMES[key]])), dtype)
    layers: dict[str, list[np.ndarray]] = {}
    for li, ffn in enumerate(_ffn_of_layers(cfg)):
        pre = f"model.layers.{li}."
        for key in _SHARED:
            layers.setdefault(key, []).append(
                lay[key][1](np.asarray(tensors[pre + _LAYER_NAMES[key]]))
            )
        if ffn == "dense":
            for key, name in _DENSE.items():
                params["ffn"].setdefault(key, []).append(np.asarray(tensors[pre + name]).T)
            continue
        for key, value in moe_from_hf(tensors, pre, cfg).items():
            params["moe"].setdefault(key, []).append(value)
    params["layers"] = {k: np.stack(v).astype(dtype) for k, v in layers.items()}
    for stack in ("ffn", "moe"):
        params[stack] = {k: np.stack(v).astype(dtype) for k, v in params[stack].items()}
    if not params["ffn"]:
        del params["ffn"]
    return params


def qwen3_moe_from_params(
    params: Params, cfg: ModelConfig, dtype: Any = None
) -> dict[str, np.ndarray]:
    """HF-named tensors (per-expert layout) of a transformer arm with MoE layers."""
    lay = _layouts(cfg.replace(moe=None))
    cast = (lambda a: a) if dtype is None else (lambda a: a.astype(np.dtype(dtype)))
    out = {_GLOBAL_NAMES["embedding"]: cast(lay["embedding"][2](np.asarray(params["embedding"])))}
    counts = {"dense": 0, "moe": 0}
    for li, ffn in enumerate(_ffn_of_layers(cfg)):
        pre = f"model.layers.{li}."
        for key in _SHARED:
            if key in params["layers"]:
                out[pre + _LAYER_NAMES[key]] = cast(
                    lay[key][2](np.asarray(params["layers"][key][li]))
                )
        j = counts[ffn]
        counts[ffn] += 1
        if ffn == "dense":
            for key, name in _DENSE.items():
                out[pre + name] = cast(np.asarray(params["ffn"][key][j]).T)
            continue
        layer = {key: np.asarray(value[j]) for key, value in params["moe"].items()}
        out.update({pre + name: cast(a) for name, a in moe_to_hf(layer, cfg).items()})
    out[_GLOBAL_NAMES["final_norm"]] = cast(np.asarray(params["final_norm"]))
    if not cfg.tie_embeddings:
        out[_GLOBAL_NAMES["lm_head"]] = cast(lay["lm_head"][2](np.asarray(params["lm_head"])))
    return out
