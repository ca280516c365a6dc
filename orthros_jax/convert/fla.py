"""flash-linear-attention (fla 0.6.0) checkpoints <-> ModelConfig/params: `model_type` "gla"
(GLAForCausalLM, our arm gla), "retnet" (RetNetForCausalLM, arm retnet) and "gated_deltanet"
(GatedDeltaNetForCausalLM, arm gdn), config.json + safetensors as fla's save_pretrained writes
(the config: fla_config.py).

Every fla block is pre-RMSNorm mixer + residual, pre-RMSNorm SwiGLU + residual (d_ff = the
config's intermediate_size, or 256 * ceil(int(D * hidden_ratio * 2/3) / 256)), a final norm and
an untied head unless tie_word_embeddings. Tensor names (per layer i, under model.layers.i.):
  attn_norm / mlp_norm.weight [D]; mlp.gate_proj / up_proj [F, D], down_proj [D, F]
  GLA:    attn.q_proj [N*H, D], k_proj [K*H, D], v_proj [K*E, D], g_proj [N*E, D] (output gate),
          gk_proj.0 [R, D], gk_proj.1 [K*H, R] + bias [K*H], o_proj [D, N*E],
          q/k/v_conv1d [channels, 1, Kc] (short conv), the norm g_norm_swish_gate (fused, the
          default) or g_norm [E] (no weight without elementwise_affine)
  RetNet: the same without gk_proj and conv
  GDN:    attn.q/k_proj [Hk*dk, D], v_proj / g_proj [Hv*dv, D], a_proj / b_proj [Hv, D],
          A_log / dt_bias [Hv], q/k/v_conv1d, o_norm [dv], o_proj [D, Hv*dv]
Options fla has that compute something we do not (hybrid `attn` layers, attnres, powlu, a
sigmoid or absent GDN output gate, no GDN conv, negative eigenvalues, conv bias, l2warp) and
any key fla's configs do not have are refused by name, before any tensor is read. Options that
only pick fla's kernels (attn_mode, fuse_*) are accepted; so are the ones fla 0.6.0 reads but
never uses (GLA's use_gk / use_gv, RetNet's use_short_conv and conv_size).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.convert.fla_config import (
    MODEL_TYPE_OF,
    check_exportable,
    fla_kind,
    linear_options,
)
from orthros_jax.layers import gdn, gla
from orthros_jax.layers.registry import KINDS

Params = dict[str, Any]


def _norm_name(cfg: ModelConfig, p: str) -> str | None:
    """fla's name of the mixer's per-head norm weight (None: no weight)."""
    o = linear_options(cfg, p)
    if not o.norm_affine:
        return None
    return "g_norm_swish_gate" if o.output_gate else "g_norm"


def _layer_map(cfg: ModelConfig) -> dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Our per-layer name -> (fla name under model.layers.i., fla shape, our shape) for the
    arm's mixer; ours = fla's transposed ([out, in] -> [in, out]) then reshaped (conv weights
    [C, 1, Kc] -> [Kc, C] then reshaped; 1-D ones only reshaped)."""
    d = cfg.d_model
    p = _kind(cfg)
    if p == gdn.KIND.name:
        g = cfg.kinds.gdn
        hk, hv, dk, dv, kc = g.num_k_heads, g.num_v_heads, g.k_head_dim, g.v_head_dim, g.conv_kernel
        return {
            "gdn_wq": ("attn.q_proj.weight", (hk * dk, d), (d, hk, dk)),
            "gdn_wk": ("attn.k_proj.weight", (hk * dk, d), (d, hk, dk)),
            "gdn_wv": ("attn.v_proj.weight", (hv * dv, d), (d, hv, dv)),
            "gdn_wz": ("attn.g_proj.weight", (hv * dv, d), (d, hv, dv)),
            "gdn_wa": ("attn.a_proj.weight", (hv, d), (d, hv)),
            "gdn_wb": ("attn.b_proj.weight", (hv, d), (d, hv)),
            "gdn_a_log": ("attn.A_log", (hv,), (hv,)),
            "gdn_dt_bias": ("attn.dt_bias", (hv,), (hv,)),
            "gdn_conv_q": ("attn.q_conv1d.weight", (hk * dk, 1, kc), (kc, hk, dk)),
            "gdn_conv_k": ("attn.k_conv1d.weight", (hk * dk, 1, kc), (kc, hk, dk)),
            "gdn_conv_v": ("attn.v_conv1d.weight", (hv * dv, 1, kc), (kc, hv, dv)),
            "gdn_norm": ("attn.o_norm.weight", (dv,), (dv,)),
            "gdn_out": ("attn.o_proj.weight", (d, hv * dv), (hv, dv, d)),
        }
    o = linear_options(cfg, p)
    n, kv, h, e = o.heads, o.kv_heads, o.k_head_dim, o.v_head_dim
    out: dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]] = {
        f"{p}_wq": ("attn.q_proj.weight", (n * h, d), (d, n, h)),
        f"{p}_wk": ("attn.k_proj.weight", (kv * h, d), (d, kv, h)),
        f"{p}_wv": ("attn.v_proj.weight", (kv * e, d), (d, kv, e)),
        f"{p}_out": ("attn.o_proj.weight", (d, n * e), (n, e, d)),
    }
    if o.output_gate:
        out[f"{p}_wg"] = ("attn.g_proj.weight", (n * e, d), (d, n, e))
    norm = _norm_name(cfg, p)
    if norm:
        out[f"{p}_norm"] = (f"attn.{norm}.weight", (e,), (e,))
    if p == gla.KIND.name:
        g = cfg.kinds.gla
        r = g.gate_rank
        out.update(
            {
                "gla_wgk1": ("attn.gk_proj.0.weight", (r, d), (d, r)),
                "gla_wgk2": ("attn.gk_proj.1.weight", (kv * h, r), (r, kv, h)),
                "gla_bgk": ("attn.gk_proj.1.bias", (kv * h,), (kv, h)),
            }
        )
        if g.short_conv:
            kc = g.conv_kernel
            for x, heads, dim in (("q", n, h), ("k", kv, h), ("v", kv, e)):
                out[f"gla_conv_{x}"] = (
                    f"attn.{x}_conv1d.weight",
                    (heads * dim, 1, kc),
                    (kc, heads, dim),
                )
    return out


_BLOCK = {
    "attn_norm": "attn_norm.weight",
    "mlp_norm": "mlp_norm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


def _kind(cfg: ModelConfig) -> str:
    """The layer kind of cfg's fla arm (a pure stack)."""
    kind = fla_kind(cfg)
    assert kind is not None, cfg.architecture  # check_exportable / config_from_fla
    return kind


def _params_key(cfg: ModelConfig) -> str:
    return KINDS[_kind(cfg)].params_key


def _to_ours(a: np.ndarray, ours: tuple[int, ...]) -> np.ndarray:
    if a.ndim == 3:  # conv [C, 1, Kc] -> [Kc, C]
        a = a[:, 0, :].T
    elif a.ndim == 2:
        a = a.T
    return a.reshape(ours)


def _to_fla(a: np.ndarray, fla: tuple[int, ...]) -> np.ndarray:
    if len(fla) == 3:
        return a.reshape(a.shape[0], -1).T[:, None, :]
    if len(fla) == 2:
        return a.reshape(fla[1], fla[0]).T
    return a.reshape(fla)


def fla_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of fla's checkpoint of cfg, with its shape."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    block: dict[str, tuple[int, ...]] = {
        "attn_norm": (d,),
        "mlp_norm": (d,),
        "w_gate": (f, d),
        "w_up": (f, d),
        "w_down": (d, f),
    }
    out: dict[str, tuple[int, ...]] = {"model.embeddings.weight": (v, d)}
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}."
        out.update({pre + _BLOCK[k]: s for k, s in block.items()})
        out.update({pre + name: shape for name, shape, _ in _layer_map(cfg).values()})
    out["model.norm.weight"] = (d,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (v, d)
    return out


def _source_names(tensors: Mapping[str, Any]) -> dict[str, str]:
    """{the name fla_tensor_shapes uses: the checkpoint's name}: with fuse_norm=False (or an
    unfused gate) fla names the per-head norm g_norm rather than g_norm_swish_gate."""
    names = {n: n for n in tensors}
    for n in tensors:
        if n.endswith("attn.g_norm.weight"):
            names[n.replace("g_norm.weight", "g_norm_swish_gate.weight")] = n
    return names


def params_from_fla(tensors: Mapping[str, Any], cfg: ModelConfig, dtype: Any = None) -> Params:
    """Params (numpy) of cfg from fla-named tensors, names and shapes validated first."""
    check_exportable(cfg)
    want = fla_tensor_shapes(cfg)
    names = _source_names(tensors)
    missing = sorted(set(want) - set(names))
    used = {names[n] for n in want if n in names}
    extra = sorted(set(tensors) - used - ({"lm_head.weight"} if cfg.tie_embeddings else set()))
    if missing or extra:
        raise ValueError(
            f"fla {MODEL_TYPE_OF[_kind(cfg)]} checkpoint of {cfg.n_layers} "
            f"layers: missing {missing[:8]}, unexpected {extra[:8]}"
        )
    for name, shape in want.items():
        src = names[name]
        got = tensors.shape(src) if hasattr(tensors, "shape") else np.shape(tensors[src])
        if tuple(got) != shape:
            raise ValueError(f"tensor {src!r} has shape {list(got)}; expected {list(shape)}")
    dtype = np.dtype(dtype or cfg.param_dtype)
    get = lambda name: np.asarray(tensors[names[name]], np.float32)
    layer_map = _layer_map(cfg)
    stack: dict[str, list[np.ndarray]] = {}
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}."
        for ours, name in _BLOCK.items():
            a = get(pre + name)
            stack.setdefault(ours, []).append(a.T if a.ndim == 2 else a)
        for ours, (name, _, shape) in layer_map.items():
            stack.setdefault(ours, []).append(_to_ours(get(pre + name), shape))
    params: Params = {
        "embedding": get("model.embeddings.weight").astype(dtype),
        "final_norm": get("model.norm.weight").astype(dtype),
        _params_key(cfg): {k: np.stack(a).astype(dtype) for k, a in stack.items()},
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = get("lm_head.weight").T.astype(dtype)
    return params


def fla_from_params(params: Params, cfg: ModelConfig, dtype: Any = None) -> dict[str, np.ndarray]:
    """fla-named tensors (numpy) of a gla / retnet / gdn model; inverse of params_from_fla."""
    check_exportable(cfg)
    cast = lambda a: np.ascontiguousarray(a if dtype is None else a.astype(np.dtype(dtype)))
    stack = {k: np.asarray(a) for k, a in params[_params_key(cfg)].items()}
    out = {"model.embeddings.weight": cast(np.asarray(params["embedding"]))}
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}."
        for ours, name in _BLOCK.items():
            a = stack[ours][i]
            out[pre + name] = cast(a.T if a.ndim == 2 else a)
        for ours, (name, shape, _) in _layer_map(cfg).items():
            out[pre + name] = cast(_to_fla(stack[ours][i], shape))
    out["model.norm.weight"] = cast(np.asarray(params["final_norm"]))
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = cast(np.asarray(params["lm_head"]).T)
    return out
