"""transformers' Mamba2ForCausalLM (model_type "mamba2") config and tensors <-> ModelConfig/params
of the pure `mamba2` arm (layers/mamba2.py, without its FFN: Mamba-2 blocks have none).

Tensors (per layer i, under backbone.layers.i.; torch Linear [out, in], ours [in, ...out]):
  norm.weight [D] -> attn_norm
  mixer.in_proj.weight [2I + 2GNs + Nh, D] (+ .bias): rows z [I], x [I], B [G*Ns], C [G*Ns],
      dt [Nh] (I = Nh*P, heads then dims) -> mamba2_wz / wx [D, Nh, P], wb / wc [D, G, Ns],
      wdt [D, Nh] (+ mamba2_bz ... bdt)
  mixer.conv1d.weight [I + 2GNs, 1, Kc] (+ .bias): channels x, B, C -> mamba2_conv_x
      [Kc, Nh, P], conv_b / conv_c [Kc, G, Ns] (+ mamba2_conv_{x,b,c}_bias)
  mixer.dt_bias, A_log, D [Nh]; mixer.norm.weight [I] -> [Nh, P]; mixer.out_proj.weight
      [D, I] (+ .bias [D]) -> mamba2_out [Nh, P, D] (+ mamba2_out_bias)
and backbone.embeddings.weight [V, D], backbone.norm_f.weight [D], lm_head.weight [V, D]
(absent when tie_word_embeddings). Options we do not compute (another hidden_act) or keys
Mamba2Config does not have are refused by name before any tensor is read; the ones that only
shape initialisation or kernels (time_step_rank, rescale_prenorm_residual, chunk_size,
residual_in_fp32: our residual stream is in the activation dtype) are accepted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.convert.common import config_with, own_arm
from orthros_jax.layers import mamba2
from orthros_jax.layers.mamba2_mixer import Mamba2Options

MAMBA2, MAMBA2_TYPE = "Mamba2ForCausalLM", "mamba2"
_KEYS = {
    "num_heads",
    "head_dim",
    "vocab_size",
    "hidden_size",
    "state_size",
    "num_hidden_layers",
    "layer_norm_epsilon",
    "expand",
    "conv_kernel",
    "n_groups",
    "use_bias",
    "use_conv_bias",
    "hidden_act",
    "initializer_range",
    "residual_in_fp32",
    "time_step_rank",
    "time_step_min",
    "time_step_max",
    "time_step_floor",
    "time_step_limit",
    "rescale_prenorm_residual",
    "chunk_size",
    "tie_word_embeddings",
    "architectures",
    "model_type",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "layer_types",
}
_GLOBAL = {
    "embedding": "backbone.embeddings.weight",
    "final_norm": "backbone.norm_f.weight",
    "lm_head": "lm_head.weight",
}
Params = dict[str, Any]


def is_mamba2(hf: Mapping[str, Any]) -> bool:
    """Whether a config.json dict is transformers' Mamba-2."""
    archs = hf.get("architectures") or []
    return hf.get("model_type") == MAMBA2_TYPE or MAMBA2 in archs


def _float(x: Any) -> float:
    """A float of config.json; transformers 5 writes inf as {"__float__": "Infinity"}."""
    return float(x["__float__"] if isinstance(x, dict) else x)


def config_from_mamba2(hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """ModelConfig of the pure mamba2 arm for a Mamba2Config dict (overrides: other fields;
    kinds={"mamba2": {...}} changes only the options it names)."""
    unknown = sorted(set(hf) - _KEYS)
    if unknown:
        raise ValueError(f"Mamba2 config.json has keys we do not know: {unknown}")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported Mamba2 hidden_act={hf['hidden_act']!r}; expected 'silu'")
    d, heads = int(hf.get("hidden_size", 4096)), int(hf.get("num_heads", 128))
    head_dim, expand = int(hf.get("head_dim", 64)), hf.get("expand", 2)
    if d * expand != heads * head_dim:
        raise ValueError(
            f"Mamba2 config: hidden_size * expand ({d} * {expand}) must equal num_heads * "
            f"head_dim ({heads} * {head_dim})"
        )
    limit = [_float(x) for x in hf.get("time_step_limit", (0.0, math.inf))]
    options = Mamba2Options(
        heads=heads,
        head_dim=head_dim,
        state=int(hf.get("state_size", 128)),
        groups=int(hf.get("n_groups", 8)),
        conv_kernel=int(hf.get("conv_kernel", 4)),
        use_bias=bool(hf.get("use_bias", False)),
        conv_bias=bool(hf.get("use_conv_bias", True)),
        ffn=False,
        dt_limit=(limit[0], limit[1]),
        dt_min=float(hf.get("time_step_min", 0.001)),
        dt_max=float(hf.get("time_step_max", 0.1)),
        dt_floor=float(hf.get("time_step_floor", 1e-4)),
    )
    fields: dict[str, Any] = dict(
        architecture=own_arm(mamba2.KIND.name),
        layer_types=(mamba2.KIND.name,),
        kinds={mamba2.KIND.name: options},
        vocab_size=int(hf.get("vocab_size", 32768)),
        d_model=d,
        n_layers=int(hf.get("num_hidden_layers", 64)),
        norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(hf.get("initializer_range", 0.1)),
    )
    return config_with(fields, overrides)


def mamba2_config_from(cfg: ModelConfig, *, torch_dtype: str | None = None) -> dict[str, Any]:
    """config.json contents for exporting a pure mamba2 model without FFN (anything else is
    refused: transformers' Mamba-2 has no other layer and no MLP)."""
    o = mamba2.check_exportable(cfg)
    inner = o.heads * o.head_dim
    if inner % cfg.d_model:
        raise ValueError(
            f"a Mamba2 export needs heads * head_dim ({inner}) a multiple of d_model "
            f"({cfg.d_model}): transformers' expand is an int"
        )
    return {
        "architectures": [MAMBA2],
        "model_type": MAMBA2_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_heads": o.heads,
        "head_dim": o.head_dim,
        "expand": inner // cfg.d_model,
        "state_size": o.state,
        "n_groups": o.groups,
        "conv_kernel": o.conv_kernel,
        "use_bias": o.use_bias,
        "use_conv_bias": o.conv_bias,
        "hidden_act": "silu",
        "layer_norm_epsilon": cfg.norm_eps,
        "time_step_limit": list(o.dt_limit),
        "time_step_min": o.dt_min,
        "time_step_max": o.dt_max,
        "time_step_floor": o.dt_floor,
        "residual_in_fp32": True,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "use_cache": True,
        "torch_dtype": torch_dtype or cfg.param_dtype,
    }


def _in_rows(o: Mamba2Options) -> dict[str, tuple[int, ...]]:
    """in_proj's row blocks, in order, with our per-layer shape (after [D])."""
    n, e, g, s = o.heads, o.head_dim, o.groups, o.state
    return {"z": (n, e), "x": (n, e), "b": (g, s), "c": (g, s), "dt": (n,)}


def layer_tensor_shapes(o: Mamba2Options, d: int) -> dict[str, tuple[int, ...]]:
    """HF shapes of one layer's tensors (names under backbone.layers.i.)."""
    inner, conv = o.heads * o.head_dim, o.heads * o.head_dim + 2 * o.groups * o.state
    rows = sum(math.prod(s) for s in _in_rows(o).values())
    out = {"norm.weight": (d,), "mixer.in_proj.weight": (rows, d)}
    out.update(
        {
            "mixer.conv1d.weight": (conv, 1, o.conv_kernel),
            "mixer.dt_bias": (o.heads,),
            "mixer.A_log": (o.heads,),
            "mixer.D": (o.heads,),
            "mixer.norm.weight": (inner,),
            "mixer.out_proj.weight": (d, inner),
        }
    )
    if o.use_bias:
        out.update({"mixer.in_proj.bias": (rows,), "mixer.out_proj.bias": (d,)})
    if o.conv_bias:
        out["mixer.conv1d.bias"] = (conv,)
    return out


def layer_from_hf(t: Mapping[str, np.ndarray], o: Mamba2Options, d: int) -> dict[str, np.ndarray]:
    """Our per-layer parameters from one layer's HF tensors (names as layer_tensor_shapes)."""
    rows = _in_rows(o)
    p: dict[str, np.ndarray] = {"attn_norm": t["norm.weight"]}
    w, start = t["mixer.in_proj.weight"], 0
    for name, shape in rows.items():
        size = math.prod(shape)
        p[f"mamba2_w{name}"] = w[start : start + size].T.reshape(d, *shape)
        if o.use_bias:
            p[f"mamba2_b{name}"] = t["mixer.in_proj.bias"][start : start + size].reshape(shape)
        start += size
    conv, start = t["mixer.conv1d.weight"][:, 0, :], 0
    for name in "xbc":
        shape = rows[name]
        size = math.prod(shape)
        p[f"mamba2_conv_{name}"] = conv[start : start + size].T.reshape(-1, *shape)
        if o.conv_bias:
            bias = t["mixer.conv1d.bias"][start : start + size]
            p[f"mamba2_conv_{name}_bias"] = bias.reshape(shape)
        start += size
    p.update(
        mamba2_dt_bias=t["mixer.dt_bias"], mamba2_a_log=t["mixer.A_log"], mamba2_d=t["mixer.D"]
    )
    p["mamba2_norm"] = t["mixer.norm.weight"].reshape(o.heads, o.head_dim)
    p["mamba2_out"] = t["mixer.out_proj.weight"].T.reshape(o.heads, o.head_dim, d)
    if o.use_bias:
        p["mamba2_out_bias"] = t["mixer.out_proj.bias"]
    return p


def layer_to_hf(p: Mapping[str, np.ndarray], o: Mamba2Options, d: int) -> dict[str, np.ndarray]:
    """One layer's HF tensors from our per-layer parameters (inverse of layer_from_hf)."""
    rows = _in_rows(o)
    flat = lambda a: np.asarray(a).reshape(a.shape[0], -1)
    t = {"norm.weight": np.asarray(p["attn_norm"])}
    t["mixer.in_proj.weight"] = np.concatenate([flat(p[f"mamba2_w{n}"]).T for n in rows])
    if o.use_bias:
        t["mixer.in_proj.bias"] = np.concatenate([np.ravel(p[f"mamba2_b{n}"]) for n in rows])
    t["mixer.conv1d.weight"] = np.concatenate([flat(p[f"mamba2_conv_{n}"]).T for n in "xbc"])[
        :, None, :
    ]
    if o.conv_bias:
        t["mixer.conv1d.bias"] = np.concatenate(
            [np.ravel(p[f"mamba2_conv_{n}_bias"]) for n in "xbc"]
        )
    t.update(
        {
            "mixer.dt_bias": p["mamba2_dt_bias"],
            "mixer.A_log": p["mamba2_a_log"],
            "mixer.D": p["mamba2_d"],
            "mixer.norm.weight": np.ravel(p["mamba2_norm"]),
            "mixer.out_proj.weight": np.asarray(p["mamba2_out"]).reshape(-1, d).T,
        }
    )
    if o.use_bias:
        t["mixer.out_proj.bias"] = p["mamba2_out_bias"]
    return {k: np.asarray(v) for k, v in t.items()}


def mamba2_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of a checkpoint of cfg, with its shape."""
    o, d, v = mamba2.check_exportable(cfg), cfg.d_model, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {_GLOBAL["embedding"]: (v, d)}
    for i in range(cfg.n_layers):
        for name, shape in layer_tensor_shapes(o, d).items():
            out[f"backbone.layers.{i}.{name}"] = shape
    out[_GLOBAL["final_norm"]] = (d,)
    if not cfg.tie_embeddings:
        out[_GLOBAL["lm_head"]] = (v, d)
    return out


def _check_tensors(tensors: Mapping[str, Any], cfg: ModelConfig) -> None:
    expected = mamba2_tensor_shapes(cfg)
    found = set(tensors) - ({_GLOBAL["lm_head"]} if cfg.tie_embeddings else set())
    missing, extra = sorted(set(expected) - found), sorted(found - set(expected))
    if missing or extra:
        raise ValueError(
            f"Mamba2 checkpoint does not match its config.json: missing {missing[:8]}, "
            f"unexpected {extra[:8]}"
        )
    for name, shape in expected.items():
        got = tuple(getattr(tensors, "shape", lambda n: np.shape(tensors[n]))(name))
        if got != shape:
            raise ValueError(f"tensor {name!r} has shape {list(got)}; expected {list(shape)}")


def params_from_mamba2(tensors: Mapping[str, Any], cfg: ModelConfig, dtype: Any = None) -> Params:
    """OrthrosLM params (numpy) of the pure mamba2 arm from HF-named tensors, checked first."""
    _check_tensors(tensors, cfg)
    o, d = mamba2.check_exportable(cfg), cfg.d_model
    cast = lambda a: np.asarray(a, np.dtype(dtype or cfg.param_dtype))
    layers = []
    for i in range(cfg.n_layers):
        names = layer_tensor_shapes(o, d)
        t = {n: np.asarray(tensors[f"backbone.layers.{i}.{n}"]) for n in names}
        layers.append(layer_from_hf(t, o, d))
    stack = {k: cast(np.stack([lp[k] for lp in layers])) for k in layers[0]}
    params: Params = {mamba2.KIND.params_key: stack}
    params["embedding"] = cast(tensors[_GLOBAL["embedding"]])
    params["final_norm"] = cast(tensors[_GLOBAL["final_norm"]])
    if not cfg.tie_embeddings:
        params["lm_head"] = cast(np.asarray(tensors[_GLOBAL["lm_head"]]).T)
    return params


def mamba2_from_params(params: Params, cfg: ModelConfig, dtype: Any = None) -> dict[str, Any]:
    """HF-named tensors (numpy) from pure-mamba2 params; inverse of params_from_mamba2."""
    o, d = mamba2.check_exportable(cfg), cfg.d_model
    cast = (lambda a: np.asarray(a)) if dtype is None else (lambda a: np.asarray(a, dtype))
    stack = params[mamba2.KIND.params_key]
    out = {_GLOBAL["embedding"]: cast(params["embedding"])}
    for i in range(cfg.n_layers):
        layer = layer_to_hf({k: np.asarray(v[i]) for k, v in stack.items()}, o, d)
        out.update({f"backbone.layers.{i}.{k}": cast(v) for k, v in layer.items()})
    out[_GLOBAL["final_norm"]] = cast(params["final_norm"])
    if not cfg.tie_embeddings:
        out[_GLOBAL["lm_head"]] = cast(np.asarray(params["lm_head"]).T)
    return out
