"""Exact mapping between one `transformers` Qwen3_5GatedDeltaNet layer's tensors and the GDN
parameter dict of orthros_jax.layers.gdn_mixer (for the Qwen3.5 importer/exporter).

HF's fused `in_proj_qkv` [2*Hk*dk + Hv*dv, D] (rows: q heads, k heads, v heads, each head's
dims contiguous) and `conv1d.weight` [same, 1, Kc] are split into head-shaped q/k/v arrays so
the heads axis can be sharded; torch Linear weights [out, in] become [in, ...out].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.layers.gdn_mixer import check_params, gdn_dims

HF_NAMES: tuple[str, ...] = (
    "in_proj_qkv.weight",
    "in_proj_z.weight",
    "in_proj_b.weight",
    "in_proj_a.weight",
    "conv1d.weight",
    "dt_bias",
    "A_log",
    "norm.weight",
    "out_proj.weight",
)


# cfg.kinds.gdn's options -> their Qwen3.5 config.json keys (Qwen3.5 and the remote format).
GDN_CONFIG_KEYS = {
    "num_k_heads": "linear_num_key_heads",
    "num_v_heads": "linear_num_value_heads",
    "k_head_dim": "linear_key_head_dim",
    "v_head_dim": "linear_value_head_dim",
    "conv_kernel": "linear_conv_kernel_dim",
}


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each HF_NAMES tensor of one layer (torch Linear layout [out, in])."""
    d, kc = cfg.d_model, cfg.kinds.gdn.conv_kernel
    hk, hv, dk, dv = gdn_dims(cfg)
    conv_dim = 2 * hk * dk + hv * dv
    return {
        "in_proj_qkv.weight": (conv_dim, d),
        "in_proj_z.weight": (hv * dv, d),
        "in_proj_b.weight": (hv, d),
        "in_proj_a.weight": (hv, d),
        "conv1d.weight": (conv_dim, 1, kc),
        "dt_bias": (hv,),
        "A_log": (hv,),
        "norm.weight": (dv,),
        "out_proj.weight": (d, hv * dv),
    }


def _check_hf(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> None:
    """ValueError unless tensors are exactly one layer's HF_NAMES at hf_tensor_shapes."""
    missing = [n for n in HF_NAMES if n not in tensors]
    extra = [n for n in tensors if n not in HF_NAMES]
    if missing or extra:
        raise ValueError(
            f"GDN layer tensors: missing {missing}, unexpected {extra}; expected exactly "
            f"{list(HF_NAMES)} (the keys of one Qwen3_5GatedDeltaNet's state_dict)"
        )
    for name, shape in hf_tensor_shapes(cfg).items():
        if tuple(tensors[name].shape) != shape:
            hk, hv, dk, dv = gdn_dims(cfg)
            raise ValueError(
                f"GDN tensor {name} has shape {tuple(tensors[name].shape)}, expected {shape} "
                f"for the config (D={cfg.d_model}, Hk={hk}, Hv={hv}, dk={dk}, dv={dv}, "
                f"kernel={cfg.kinds.gdn.conv_kernel})"
            )


def hf_to_gdn(
    hf_layer_tensors: Mapping[str, np.ndarray], cfg: ModelConfig
) -> dict[str, np.ndarray]:
    """One layer's `linear_attn.*` tensors (keys without that prefix, as HF_NAMES; torch
    Linear layout [out, in]) -> this module's parameter dict. Exact (reshapes/transposes)."""
    t = {n: np.asarray(x) for n, x in hf_layer_tensors.items()}
    _check_hf(t, cfg)
    d = cfg.d_model
    hk, hv, dk, dv = gdn_dims(cfg)
    qd = hk * dk
    qkv, conv = t["in_proj_qkv.weight"], t["conv1d.weight"][:, 0, :]  # [C, D], [C, Kc]
    parts = ((0, qd, hk, dk), (qd, 2 * qd, hk, dk), (2 * qd, 2 * qd + hv * dv, hv, dv))
    out = {}
    for key, (lo, hi, heads, hd) in zip("qkv", parts, strict=True):
        out[f"gdn_w{key}"] = qkv[lo:hi].T.reshape(d, heads, hd)
        out[f"gdn_conv_{key}"] = conv[lo:hi].T.reshape(-1, heads, hd)
    out["gdn_wz"] = t["in_proj_z.weight"].T.reshape(d, hv, dv)
    out["gdn_wb"] = t["in_proj_b.weight"].T.copy()
    out["gdn_wa"] = t["in_proj_a.weight"].T.copy()
    out["gdn_dt_bias"] = t["dt_bias"].copy()
    out["gdn_a_log"] = t["A_log"].copy()
    out["gdn_norm"] = t["norm.weight"].copy()
    out["gdn_out"] = t["out_proj.weight"].T.reshape(hv, dv, d)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def gdn_to_hf(params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Inverse of hf_to_gdn: this module's parameter dict -> HF_NAMES tensors (numpy)."""
    p = {n: np.asarray(x) for n, x in params.items()}
    check_params(p, cfg)
    d = cfg.d_model
    qkv = np.concatenate([p[f"gdn_w{k}"].reshape(d, -1).T for k in "qkv"], axis=0)
    kc = cfg.kinds.gdn.conv_kernel
    conv = np.concatenate([p[f"gdn_conv_{k}"].reshape(kc, -1).T for k in "qkv"], axis=0)
    out = {
        "in_proj_qkv.weight": qkv,
        "in_proj_z.weight": p["gdn_wz"].reshape(d, -1).T,
        "in_proj_b.weight": p["gdn_wb"].T,
        "in_proj_a.weight": p["gdn_wa"].T,
        "conv1d.weight": conv[:, None, :],
        "dt_bias": p["gdn_dt_bias"],
        "A_log": p["gdn_a_log"],
        "norm.weight": p["gdn_norm"],
        "out_proj.weight": p["gdn_out"].reshape(-1, d).T,
    }
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
