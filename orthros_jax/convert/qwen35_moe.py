"""Hugging Face Qwen3.5-MoE (text, `Qwen3_5MoeForCausalLM`) <-> a Qwen3.5 arm with MoE layers.

Qwen3.5-MoE is Qwen3.5 (qwen35_config.py / qwen35.py: the layer cycle of GDN and attention
layers, their tensors, norms and embeddings, reused as they are) whose every FFN is
transformers' Qwen3_5MoeSparseMoeBlock: a softmax top-k router whose k gates are always
renormalised, E SwiGLU experts and one always-on shared SwiGLU expert scaled by
sigmoid(x @ shared_expert_gate). It imports as ModelConfig.moe with norm_topk_prob=True,
shared_expert = shared_expert_intermediate_size and ffn_cycle ("moe",) (tensors: moe_hf.py,
either expert layout; export writes the per-expert one, as save_pretrained does).

Qwen3.5-MoE has no dense layers: its block has no decoder_sparse_step / mlp_only_layers /
intermediate_size / norm_topk_prob (transformers' config drops them and its model ignores
them); those keys pass at the value it computes and are refused, by name, at any other, as are
a zero-width shared expert and other families' MoE options. A checkpoint with GDN layers
routes output copies independently (ModelConfig.moe.routing='independent'), the routing its
two-stream form Orthros-H allows (paired routing reruns the last prompt token, which recurrent
layers cannot); override with moe=dict(routing=...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.config.moe import MoEOptions
from orthros_jax.convert.common import config_with
from orthros_jax.convert.moe_hf import (
    is_fused,
    moe_config_keys,
    moe_from_hf,
    moe_options_of,
    moe_tensor_shapes,
    moe_to_hf,
)
from orthros_jax.convert.qwen35 import TextTensors, params_from_qwen35, qwen35_from_params
from orthros_jax.convert.qwen35_config import (
    GDN,
    check_config,
    qwen35_family,
    qwen35_fields,
    text_config_from,
)

QWEN35_MOE, QWEN35_MOE_TYPE = "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"
# The MoE's sizes are required: transformers' defaults (256 experts, top-8) are a 35B model's.
_NEEDED = (
    "num_hidden_layers",
    "hidden_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)
# Qwen3-MoE / Qwen3-Next options the Qwen3.5-MoE block does not have, at what it computes.
_NEUTRAL: dict[str, Any] = {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}
# Other families' MoE options (DeepSeek's shared experts and leading dense layers).
_REFUSED = ("n_shared_experts", "first_k_dense_replace", "n_routed_experts")
Params = dict[str, Any]


def is_qwen35_moe(hf: Mapping[str, Any]) -> bool:
    """Whether a config.json dict is a Qwen3.5-MoE one (the text model or its multimodal
    wrapper, which config_from_qwen35_moe refuses by name)."""
    return qwen35_family(hf) == "moe"


def check_moe(cfg: ModelConfig) -> None:
    """ValueError naming the field unless cfg's MoE is the Qwen3.5-MoE block: every layer a
    MoE layer, renormalised top-k gates and a shared expert."""
    moe = cfg.moe
    if moe is None:
        raise ValueError(f"{QWEN35_MOE} needs ModelConfig.moe (every layer is a MoE layer)")
    if set(moe.ffn_cycle) != {"moe"}:
        raise ValueError(
            f"ModelConfig.moe.ffn_cycle={moe.ffn_cycle!r}: {QWEN35_MOE} has no dense layers; "
            "expected ('moe',)"
        )
    if not moe.norm_topk_prob:
        raise ValueError(f"ModelConfig.moe.norm_topk_prob=False: {QWEN35_MOE} renormalises")
    if not moe.shared_expert:
        raise ValueError(f"ModelConfig.moe.shared_expert=0: {QWEN35_MOE} has a shared expert")


def config_from_qwen35_moe(
    hf: Mapping[str, Any], *, architecture: str | None = None, window: int = 128, **overrides: Any
) -> ModelConfig:
    """ModelConfig of a Qwen3.5-MoE config.json dict: the checkpoint's own arm (hybrid, gdn or
    transformer) with ModelConfig.moe, or its two-stream conversion (orthros_h / orthros);
    overrides as config_from_qwen35's (a "moe" dict of MoEOptions fields changes those)."""
    check_config(hf, QWEN35_MOE, QWEN35_MOE_TYPE)
    missing = [k for k in _NEEDED if k not in hf]
    if missing:
        raise ValueError(f"{QWEN35_MOE} config.json lacks {missing}")
    wrong = {k: hf[k] for k, v in _NEUTRAL.items() if k in hf and hf[k] != v}
    wrong |= {k: hf[k] for k in _REFUSED if hf.get(k)}
    if wrong:
        raise ValueError(
            f"unsupported {QWEN35_MOE} option(s) {wrong}: its block has no such option (every "
            f"layer is a MoE layer with renormalised top-k gates and one shared expert)"
        )
    shared = hf["shared_expert_intermediate_size"]
    if not isinstance(shared, int) or shared <= 0:
        raise ValueError(f"unsupported shared_expert_intermediate_size={shared!r}; expected > 0")
    fields = qwen35_fields(hf, architecture, window)
    recurrent = GDN in fields["layer_types"]
    moe = MoEOptions(
        **moe_options_of(hf),
        norm_topk_prob=True,
        shared_expert=shared,
        routing="independent" if recurrent else None,
        ffn_cycle=("moe",),
    )
    moe = moe.replace(**dict(overrides.pop("moe", None) or {}))
    # d_ff sizes no layer here (every FFN is the MoE); the shared expert's width stands in.
    cfg = config_with(fields | {"d_ff": shared, "moe": moe}, overrides)
    check_moe(cfg)
    return cfg


def qwen35_moe_config_from(cfg: ModelConfig, *, torch_dtype: str | None = None) -> dict[str, Any]:
    """config.json of a single-stream Qwen3.5 arm with the Qwen3.5-MoE block (check_moe), as
    Qwen3_5MoeForCausalLM."""
    check_moe(cfg)
    assert cfg.moe is not None
    hf = text_config_from(cfg, torch_dtype=torch_dtype)
    del hf["intermediate_size"]  # not a key of this model (no dense FFN)
    return (
        hf
        | {"architectures": [QWEN35_MOE], "model_type": QWEN35_MOE_TYPE}
        | moe_config_keys(cfg)
        | {"shared_expert_intermediate_size": cfg.moe.shared_expert}
    )


def params_from_qwen35_moe(tensors: Mapping[str, Any], cfg: ModelConfig) -> Params:
    """Single-stream params (numpy, cfg.param_dtype) of cfg from HF-named Qwen3.5-MoE tensors,
    the names and shapes of all validated before any is read."""
    check_moe(cfg)
    tensors = TextTensors(tensors)
    layer_ffn = lambda i: moe_tensor_shapes(cfg, is_fused(tensors, f"model.layers.{i}."))
    params = params_from_qwen35(tensors, cfg, ffn=layer_ffn)
    dtype = np.dtype(cfg.param_dtype)
    stack: dict[str, np.ndarray] = {}
    for i in range(cfg.n_layers):  # ffn_cycle ("moe",): layer i is the stack's entry i
        for name, value in moe_from_hf(tensors, f"model.layers.{i}.", cfg).items():
            if name not in stack:
                stack[name] = np.empty((cfg.n_layers, *value.shape), dtype)
            stack[name][i] = value
    return params | {"moe": stack}


def qwen35_moe_from_params(
    params: Params, cfg: ModelConfig, dtype: Any = None
) -> dict[str, np.ndarray]:
    """HF-named Qwen3.5-MoE tensors (numpy, per-expert layout) of single-stream params; the
    inverse of params_from_qwen35_moe. dtype: the tensors' (default: each parameter's own)."""
    check_moe(cfg)
    out = qwen35_from_params(params, cfg, dtype)
    cast = (lambda a: a) if dtype is None else (lambda a: a.astype(np.dtype(dtype)))
    for i in range(cfg.n_layers):
        layer = {name: np.asarray(value[i]) for name, value in params["moe"].items()}
        out.update({f"model.layers.{i}.{n}": cast(a) for n, a in moe_to_hf(layer, cfg).items()})
    return out
