"""The mixture-of-experts part of the trust_remote_code export (remote.py; the PyTorch block is
hf_remote/moe_orthros.py): ModelConfig.moe as config.json keys, and the FFN stacks of a MoE
config (params["ffn"]: the dense layers', params["moe"]: the MoE layers', per moe.ffn_cycle) as
tensors under model.layers.{i}.mlp. (transformers' Qwen3-MoE / Qwen3.5-MoE names):
  moe/router [D, E]                          -> gate.weight [E, D]
  moe/w_gate, w_up [E, D, I]                 -> experts.gate_up_proj [E, 2I, D] (gate rows first)
  moe/w_down [E, I, D]                       -> experts.down_proj [E, D, I]
  moe/shared_gate, shared_up [D, Is]         -> shared_expert.gate_proj, up_proj.weight [Is, D]
  moe/shared_down [Is, D]                    -> shared_expert.down_proj.weight [D, Is]
  moe/shared_router [D, 1]                   -> shared_expert_gate.weight [1, D]
  ffn/w_gate, w_up [D, F], w_down [F, D]     -> gate_proj, up_proj, down_proj.weight (as dense)
Without ModelConfig.moe nothing here applies: the dense FFN is in the kinds' parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.config.moe import MoEOptions
from orthros_jax.layers.ffn import FFNS

Params = dict[str, Any]
# MoEOptions field -> config.json key (impl, the experts' kernel here, is not the model's).
CONFIG_KEYS = {
    "n_experts": "num_experts",
    "top_k": "num_experts_per_tok",
    "d_expert": "moe_intermediate_size",
    "norm_topk_prob": "norm_topk_prob",
    "shared_expert": "shared_expert_intermediate_size",
    "routing": "moe_routing",
    "aux_loss_coef": "router_aux_loss_coef",
    "z_loss_coef": "router_z_loss_coef",
}
# our name -> its HF name under mlp. (each the swap of its last two axes: torch's [out, in]),
# for every FFN parameter but the fused gate / up experts.
_NAMES = {
    "router": "gate.weight",
    "w_down": "experts.down_proj",
    "shared_gate": "shared_expert.gate_proj.weight",
    "shared_up": "shared_expert.up_proj.weight",
    "shared_down": "shared_expert.down_proj.weight",
    "shared_router": "shared_expert_gate.weight",
}
_DENSE = {"w_gate": "gate_proj.weight", "w_up": "up_proj.weight", "w_down": "down_proj.weight"}
_FUSED = "experts.gate_up_proj"


def moe_config(cfg: ModelConfig) -> dict[str, Any]:
    """config.json's MoE keys of cfg ({} without moe): CONFIG_KEYS and mlp_only_layers (the
    dense layers of moe.ffn_cycle)."""
    if cfg.moe is None:
        return {}
    hf = {key: getattr(cfg.moe, name) for name, key in CONFIG_KEYS.items()}
    types = cfg.moe.ffn_types(cfg.n_layers)
    return hf | {"mlp_only_layers": [i for i, t in enumerate(types) if t == "dense"]}


def moe_fields(hf: Mapping[str, Any]) -> dict[str, MoEOptions | None]:
    """ModelConfig's moe field of a remote config.json dict (None without num_experts):
    ffn_cycle is the shortest period of its layers' FFNs."""
    if not hf.get("num_experts"):
        return {"moe": None}
    dense = set(hf.get("mlp_only_layers") or [])
    pattern = ["dense" if i in dense else "moe" for i in range(int(hf["num_hidden_layers"]))]
    n = len(pattern)
    p = next(p for p in range(1, n + 1) if n % p == 0 and pattern == pattern[:p] * (n // p))
    options = {name: hf[key] for name, key in CONFIG_KEYS.items() if key in hf}
    return {"moe": MoEOptions(**options, ffn_cycle=tuple(pattern[:p]))}


def ffn_slots(cfg: ModelConfig) -> list[tuple[str, int]]:
    """(FFN choice, index in its stack) of every layer, in order ([] without moe)."""
    if cfg.moe is None:
        return []
    n = len(cfg.layer_types)
    return [(cfg.ffn_types[j], cfg.ffn_index(c, j)) for c in range(cfg.n_cycles) for j in range(n)]


def _t(a: np.ndarray) -> np.ndarray:
    """ours [..., in, out] <-> torch's [..., out, in]."""
    return np.swapaxes(a, -1, -2)


def ffn_to_hf(params: Params, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """HF-named tensors (numpy, the params' dtype) of every layer's FFN under a MoE config."""
    out: dict[str, np.ndarray] = {}
    for i, (ffn, fi) in enumerate(ffn_slots(cfg)):
        pre = f"model.layers.{i}.mlp."
        p = {n: np.asarray(a[fi]) for n, a in params[FFNS[ffn].params_key].items()}
        names = _DENSE if ffn == "dense" else _NAMES
        out.update({pre + names[n]: _t(a) for n, a in p.items() if n in names})
        if ffn != "dense":
            out[pre + _FUSED] = np.concatenate([_t(p["w_gate"]), _t(p["w_up"])], axis=1)
    return out


def ffn_from_hf(get: Callable[[str, tuple[int, ...]], np.ndarray], cfg: ModelConfig) -> Params:
    """The FFN stacks ({"ffn": ..., "moe": ...}, numpy, cfg.param_dtype; {} without moe) of
    HF-named tensors; get(name, shape) reads one, ValueError when missing or misshapen."""
    dtype = np.dtype(cfg.param_dtype)
    read = lambda name, shape: get(name, shape).reshape(shape)
    stacks: Params = {}
    for i, (ffn, fi) in enumerate(ffn_slots(cfg)):
        pre = f"model.layers.{i}.mlp."
        shapes = {n: tuple(d.shape) for n, d in FFNS[ffn].params(cfg).items()}
        names = _DENSE if ffn == "dense" else _NAMES
        values = {
            n: _t(read(pre + hf, (*shapes[n][:-2], shapes[n][-1], shapes[n][-2])))
            for n, hf in names.items()
            if n in shapes
        }
        if ffn != "dense":
            e, d, width = shapes["w_gate"]
            gate_up = read(pre + _FUSED, (e, 2 * width, d))
            values |= {"w_gate": _t(gate_up[:, :width]), "w_up": _t(gate_up[:, width:])}
        stack = stacks.setdefault(FFNS[ffn].params_key, {})
        for n, value in values.items():
            if n not in stack:
                stack[n] = np.empty((cfg.ffn_layers(ffn), *shapes[n]), dtype)
            stack[n][fi] = value
    return stacks
