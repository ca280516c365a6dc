"""One mixture-of-experts layer's tensors in transformers' Qwen MoE blocks (Qwen3-MoE,
Qwen3.5-MoE) <-> its layers/moe.py parameters, for the qwen3_moe and qwen35_moe converters.

Names under the layer's prefix (model.layers.{i}.); torch Linear [out, in] -> ours [in, out]:
  mlp.gate.weight [E, D]                               -> router [D, E]
  mlp.experts.{e}.gate_proj / up_proj.weight [I, D]    -> w_gate / w_up [E, D, I]
  mlp.experts.{e}.down_proj.weight [D, I]              -> w_down [E, I, D]
  (or transformers 5's fused mlp.experts.gate_up_proj [E, 2I, D], gate rows first, and
  mlp.experts.down_proj [E, D, I]: what its modules hold; its save_pretrained writes the
  per-expert layout, which both transformers 4 and 5 load, and so does export here)
  mlp.shared_expert.gate_proj / up_proj.weight [Is, D] -> shared_gate / shared_up [D, Is]
  mlp.shared_expert.down_proj.weight [D, Is]           -> shared_down [Is, D]
  mlp.shared_expert_gate.weight [1, D]                 -> shared_router [D, 1]
The shared expert's tensors belong to a layer when ModelConfig.moe.shared_expert > 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.convert.hf_weights import _shape_of

FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_EXPERT = {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}
# Every other parameter: our name -> its HF name, each the transpose of ours.
_PLAIN = {
    "router": "mlp.gate.weight",
    "shared_gate": "mlp.shared_expert.gate_proj.weight",
    "shared_up": "mlp.shared_expert.up_proj.weight",
    "shared_down": "mlp.shared_expert.down_proj.weight",
    "shared_router": "mlp.shared_expert_gate.weight",
}


def is_fused(tensors: Mapping[str, Any], pre: str) -> bool:
    """Whether the layer under prefix `pre` stores its experts fused (transformers 5)."""
    return pre + FUSED[0] in tensors


def _plain_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Our name -> the HF shape of each _PLAIN tensor cfg's MoE layer has."""
    assert cfg.moe is not None
    d, e, s = cfg.d_model, cfg.moe.n_experts, cfg.moe.shared_expert
    shapes: dict[str, tuple[int, ...]] = {"router": (e, d)}
    if s:
        shapes |= {"shared_gate": (s, d), "shared_up": (s, d), "shared_down": (d, s)}
        shapes["shared_router"] = (1, d)
    return shapes


def moe_tensor_shapes(cfg: ModelConfig, fused: bool) -> dict[str, tuple[int, ...]]:
    """Every HF tensor of one MoE layer of cfg (names under the layer's prefix) with its shape,
    in the fused or the per-expert layout."""
    assert cfg.moe is not None
    e, i, d = cfg.moe.n_experts, cfg.moe.d_expert, cfg.d_model
    out = {_PLAIN[name]: shape for name, shape in _plain_shapes(cfg).items()}
    if fused:
        return out | {FUSED[0]: (e, 2 * i, d), FUSED[1]: (e, d, i)}
    for j in range(e):
        for ours, hf in _EXPERT.items():
            out[f"mlp.experts.{j}.{hf}.weight"] = (d, i) if ours == "w_down" else (i, d)
    return out


def _check(tensors: Mapping[str, Any], pre: str, cfg: ModelConfig, fused: bool) -> None:
    for name, shape in moe_tensor_shapes(cfg, fused).items():
        if pre + name not in tensors:
            raise ValueError(f"checkpoint is missing MoE tensor {pre + name!r}")
        got = _shape_of(tensors, pre + name)
        if tuple(got) != shape:
            raise ValueError(f"tensor {pre + name!r} has shape {list(got)}; expected {list(shape)}")


def moe_from_hf(tensors: Mapping[str, Any], pre: str, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """One MoE layer's params (numpy, the checkpoint's dtype; no layers axis) from the HF
    tensors under prefix `pre`, either expert layout; ValueError naming a missing or misshapen
    tensor before any is read."""
    assert cfg.moe is not None
    fused = is_fused(tensors, pre)
    _check(tensors, pre, cfg, fused)
    t = lambda a: np.swapaxes(np.asarray(a), -1, -2)
    out = {name: t(tensors[pre + _PLAIN[name]]) for name in _plain_shapes(cfg)}
    if fused:
        i = cfg.moe.d_expert
        gate_up = t(tensors[pre + FUSED[0]])  # [E, D, 2I]
        out |= {"w_gate": gate_up[..., :i], "w_up": gate_up[..., i:]}
        return out | {"w_down": t(tensors[pre + FUSED[1]])}
    for ours, hf in _EXPERT.items():
        names = [f"{pre}mlp.experts.{j}.{hf}.weight" for j in range(cfg.moe.n_experts)]
        out[ours] = np.stack([t(tensors[n]) for n in names])
    return out


def moe_to_hf(p: Mapping[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """HF tensors (per-expert layout, names under the layer's prefix) of one MoE layer's params
    p (no layers axis); the inverse of moe_from_hf."""
    assert cfg.moe is not None
    t = lambda a: np.ascontiguousarray(np.swapaxes(np.asarray(a), -1, -2))
    out = {_PLAIN[name]: t(p[name]) for name in _plain_shapes(cfg)}
    for ours, hf in _EXPERT.items():
        for j in range(cfg.moe.n_experts):
            out[f"mlp.experts.{j}.{hf}.weight"] = t(np.asarray(p[ours])[j])
    return out


def moe_options_of(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The MoEOptions fields Qwen3-MoE's and Qwen3.5-MoE's config.json keys share: n_experts,
    top_k, d_expert and aux_loss_coef (router_aux_loss_coef when output_router_logits, as
    transformers adds it to the loss only then)."""
    on = hf.get("output_router_logits")
    return {
        "n_experts": int(hf.get("num_experts") or hf.get("num_local_experts") or 0),
        "top_k": int(hf["num_experts_per_tok"]),
        "d_expert": int(hf["moe_intermediate_size"]),
        "aux_loss_coef": float(hf.get("router_aux_loss_coef", 0.001)) if on else 0.0,
    }


def moe_config_keys(cfg: ModelConfig) -> dict[str, Any]:
    """The inverse of moe_options_of: those config.json keys of cfg.moe."""
    assert cfg.moe is not None
    return {
        "num_experts": cfg.moe.n_experts,
        "num_experts_per_tok": cfg.moe.top_k,
        "moe_intermediate_size": cfg.moe.d_expert,
        "router_aux_loss_coef": cfg.moe.aux_loss_coef,
        "output_router_logits": cfg.moe.aux_loss_coef > 0,
    }
