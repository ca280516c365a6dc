"""Hugging Face Qwen3.5 (text, `Qwen3_5ForCausalLM`) config and tensors <-> ModelConfig/params.

Qwen3.5 is a Linear Hybrid: `layer_types` repeats a cycle of "linear_attention" (gated DeltaNet,
our kind "gdn") and "full_attention" (our "attention") layers. Its attention uses q/k norm, a
sigmoid output gate (q_proj holds, per head, the query then the gate: [N * 2H, D]), partial
rotary and zero-centred RMSNorms (scale 1 + w); its GDN layers map through gdn_hf. A config
with both kinds imports as the `hybrid` arm (all linear: `gdn`; all full attention:
`transformer`); `orthros_h` / `orthros` are their two-stream conversions (identity SO,
convert.orthros.from_transformer). Mixture-of-experts variants (Qwen3_5Moe*) and the
multimodal wrapper are refused by name, before any tensor is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from orthros_jax.arms import TWO_STREAM_FORM
from orthros_jax.config import ModelConfig
from orthros_jax.convert.common import config_with
from orthros_jax.convert.gdn_hf import GDN_CONFIG_KEYS, gdn_to_hf, hf_tensor_shapes, hf_to_gdn
from orthros_jax.convert.gdn_hf import HF_NAMES as GDN_HF_NAMES
from orthros_jax.convert.hf_config import shape_fields

QWEN35, QWEN35_TYPE = "Qwen3_5ForCausalLM", "qwen3_5_text"
HF_KIND = {"linear_attention": "gdn", "full_attention": "attention"}
OUR_KIND = {v: k for k, v in HF_KIND.items()}
# The single-stream arm a kind set imports as, and its two-stream (Orthros) conversion.
OWN_ARM = {
    frozenset({"gdn"}): "gdn",
    frozenset({"gdn", "attention"}): "hybrid",
    frozenset({"attention"}): "transformer",
}
_MOE_KEYS = ("num_experts", "num_local_experts", "moe_intermediate_size", "num_experts_per_tok")
_BLOCK = {
    "attn_norm": "input_layernorm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
_ATTN = {"wk": "k_proj", "wv": "v_proj", "wo": "o_proj", "q_norm": "q_norm", "k_norm": "k_norm"}
Params = dict[str, Any]


def is_qwen35(hf: Mapping[str, Any]) -> bool:
    """Whether a config.json dict is a Qwen3.5 one (ValueError for its MoE variants)."""
    archs = [str(a) for a in hf.get("architectures") or []]
    model_type = str(hf.get("model_type") or "")
    moe = [a for a in archs if a.startswith("Qwen3_5Moe")]
    if moe or model_type.startswith("qwen3_5_moe"):
        raise ValueError(
            f"unsupported architecture {moe or model_type!r}: Qwen3.5 mixture-of-experts is not "
            f"implemented; supported: {QWEN35} (dense text model)"
        )
    return any(a.startswith("Qwen3_5") for a in archs) or model_type.startswith("qwen3_5")


def _check_config(hf: Mapping[str, Any]) -> None:
    archs = list(hf.get("architectures") or [QWEN35])
    if archs != [QWEN35] or hf.get("model_type", QWEN35_TYPE) != QWEN35_TYPE:
        raise ValueError(
            f"unsupported Qwen3.5 config (architectures {archs}, model_type "
            f"{hf.get('model_type')!r}): expected {QWEN35} / {QWEN35_TYPE!r}, the text model "
            "(save the language model of a multimodal checkpoint on its own)"
        )
    moe = [k for k in _MOE_KEYS if hf.get(k)]
    if moe:
        raise ValueError(f"unsupported Qwen3.5 mixture-of-experts config ({', '.join(moe)} set)")
    if hf.get("attention_bias"):
        raise ValueError("unsupported attention_bias=True: expected False (no bias terms)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act={hf['hidden_act']!r}; expected 'silu'")
    rope = dict(hf.get("rope_parameters") or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"unsupported rope_type {rope['rope_type']!r}; expected 'default'")


def layer_cycle(hf_layer_types: list[str]) -> tuple[str, ...]:
    """The shortest cycle of our kinds that repeats into the HF per-layer `layer_types`."""
    unknown = sorted(set(hf_layer_types) - set(HF_KIND))
    if unknown or not hf_layer_types:
        raise ValueError(
            f"Qwen3.5 layer_types {unknown or hf_layer_types}: expected a non-empty list of "
            f"{', '.join(HF_KIND)}"
        )
    kinds = [HF_KIND[t] for t in hf_layer_types]
    n = len(kinds)
    for p in range(1, n + 1):
        if n % p == 0 and all(kinds[i] == kinds[i % p] for i in range(n)):
            return tuple(kinds[:p])
    raise AssertionError("unreachable: p = n always repeats")


def config_from_qwen35(
    hf: Mapping[str, Any], *, architecture: str | None = None, window: int = 128, **overrides: Any
) -> ModelConfig:
    """ModelConfig of a Qwen3.5 config.json dict: the checkpoint's own arm by default (hybrid,
    gdn or transformer), or its two-stream conversion (orthros_h / orthros)."""
    _check_config(hf)
    n_layers = int(hf.get("num_hidden_layers", 32))
    types = hf.get("layer_types") or [
        "linear_attention"
        if (i + 1) % int(hf.get("full_attention_interval", 4))
        else "full_attention"
        for i in range(n_layers)
    ]
    if len(types) != n_layers:
        raise ValueError(f"layer_types has {len(types)} entries for {n_layers} layers")
    cycle = layer_cycle(list(types))
    own = OWN_ARM[frozenset(cycle)]
    allowed = (own, TWO_STREAM_FORM[own]) if own in TWO_STREAM_FORM else (own,)
    architecture = architecture or own
    if architecture not in allowed:
        raise ValueError(
            f"a Qwen3.5 checkpoint with layer kinds {sorted(set(cycle))} imports as "
            f"{' or '.join(allowed)}, not {architecture!r}"
        )
    rope = dict(hf.get("rope_parameters") or {})
    fields: dict[str, Any] = dict(
        vocab_size=int(hf.get("vocab_size", 248320)),
        d_model=int(hf.get("hidden_size", 4096)),
        n_layers=n_layers,
        n_heads=int(hf.get("num_attention_heads", 16)),
        n_kv_heads=int(hf.get("num_key_value_heads", 4)),
        head_dim=int(hf.get("head_dim") or 256),
        d_ff=int(hf.get("intermediate_size", 12288)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qk_norm=True,
        attn_output_gate=True,
        norm_zero_centered=True,
        partial_rotary_factor=float(
            rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
        ),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0))),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        layer_types=cycle,
        window=window,
        architecture=architecture,
        kinds={
            "gdn": dict(
                num_k_heads=int(hf.get("linear_num_key_heads", 16)),
                num_v_heads=int(hf.get("linear_num_value_heads", 32)),
                k_head_dim=int(hf.get("linear_key_head_dim", 128)),
                v_head_dim=int(hf.get("linear_value_head_dim", 128)),
                conv_kernel=int(hf.get("linear_conv_kernel_dim", 4)),
            )
        },
    )
    return config_with(fields, overrides)


def qwen35_config_from(cfg: ModelConfig, *, torch_dtype: str | None = None) -> dict[str, Any]:
    """config.json of a single-stream model with Qwen3.5's conventions (gdn / hybrid, or a
    transformer with q/k norm, output gate and zero-centred norms)."""
    check_exportable(cfg)
    return {
        "architectures": [QWEN35],
        "model_type": QWEN35_TYPE,
        **shape_fields(cfg),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
        },
        "layer_types": [OUR_KIND[kind] for kind, _ in cfg.layer_slots()],
        **{key: getattr(cfg.kinds.gdn, name) for name, key in GDN_CONFIG_KEYS.items()},
        "max_position_embeddings": 32_768,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "use_cache": True,
        "dtype": torch_dtype or cfg.param_dtype,
    }


def check_exportable(cfg: ModelConfig) -> None:
    """ValueError unless transformers' Qwen3.5 computes exactly cfg's function."""
    if cfg.architecture not in ("gdn", "hybrid", "transformer"):
        raise ValueError(
            f"only single-stream arms export to Qwen3.5 (got {cfg.architecture!r}): "
            "transformers has no Orthros output stream"
        )
    need = {
        "qk_norm": True,
        "attn_output_gate": True,
        "norm_zero_centered": True,
        "rope_type": "default",
    }
    wrong = {k: getattr(cfg, k) for k, v in need.items() if getattr(cfg, k) != v}
    if wrong:
        raise ValueError(f"a Qwen3.5 export needs {need}; this config has {wrong}")


def qwen35_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of a Qwen3.5 checkpoint of cfg, with its shape."""
    d, n, k, h, f, v = (
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.d_ff,
        cfg.vocab_size,
    )
    gdn_shapes = hf_tensor_shapes(cfg)
    attn_shapes = {
        "q_proj": (2 * n * h, d),
        "k_proj": (k * h, d),
        "v_proj": (k * h, d),
        "o_proj": (d, n * h),
        "q_norm": (h,),
        "k_norm": (h,),
    }
    out = {"model.embed_tokens.weight": (v, d)}
    for i, (kind, _) in enumerate(cfg.layer_slots()):
        pre = f"model.layers.{i}."
        block = {
            "attn_norm": (d,),
            "mlp_norm": (d,),
            "w_gate": (f, d),
            "w_up": (f, d),
            "w_down": (d, f),
        }
        out.update({pre + _BLOCK[name]: s for name, s in block.items()})
        if kind == "gdn":
            out.update({f"{pre}linear_attn.{name}": s for name, s in gdn_shapes.items()})
        else:
            out.update({f"{pre}self_attn.{name}.weight": s for name, s in attn_shapes.items()})
    out["model.norm.weight"] = (d,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (v, d)
    return out


def _check_tensors(tensors: Mapping[str, Any], cfg: ModelConfig) -> None:
    want = qwen35_tensor_shapes(cfg)
    found = {n for n in tensors if not n.endswith("rotary_emb.inv_freq")}
    if cfg.tie_embeddings:
        found.discard("lm_head.weight")
    missing, extra = sorted(set(want) - found), sorted(found - set(want))
    if missing or extra:
        raise ValueError(
            f"Qwen3.5 checkpoint for layer_types {cfg.layer_types} x {cfg.n_cycles}: missing "
            f"{missing[:8]}, unexpected {extra[:8]}"
        )
    for name, shape in want.items():
        got = tensors.shape(name) if hasattr(tensors, "shape") else np.shape(tensors[name])
        if tuple(got) != shape:
            raise ValueError(f"tensor {name!r} has shape {list(got)}; expected {list(shape)}")


def params_from_qwen35(tensors: Mapping[str, Any], cfg: ModelConfig, dtype: Any = None) -> Params:
    """Single-stream params (numpy) of cfg from HF-named Qwen3.5 tensors, validated first."""
    _check_tensors(tensors, cfg)
    dtype = np.dtype(dtype or cfg.param_dtype)
    n, h = cfg.n_heads, cfg.head_dim
    get = lambda name: np.asarray(tensors[name], np.float32)
    stacks: dict[str, dict[str, np.ndarray]] = {"attention": {}, "gdn": {}}

    def put(kind: str, li: int, name: str, value: np.ndarray) -> None:
        stack = stacks[kind]
        if name not in stack:
            stack[name] = np.empty((cfg.layers_of(kind), *value.shape), dtype)
        stack[name][li] = value

    for i, (kind, li) in enumerate(cfg.layer_slots()):
        pre = f"model.layers.{i}."
        for name, hf_name in _BLOCK.items():
            put(
                kind,
                li,
                name,
                get(pre + hf_name).T if name.startswith("w_") else get(pre + hf_name),
            )
        if kind == "gdn":
            sub = {name: get(f"{pre}linear_attn.{name}") for name in GDN_HF_NAMES}
            for name, value in hf_to_gdn(sub, cfg).items():
                put(kind, li, name, value)
            continue
        a = f"{pre}self_attn."
        qg = get(a + "q_proj.weight").reshape(n, 2, h, -1)  # per head: query rows, gate rows
        put(kind, li, "wq", qg[:, 0].transpose(2, 0, 1))
        put(kind, li, "wq_gate", qg[:, 1].transpose(2, 0, 1))
        for name in ("wk", "wv"):
            w = get(f"{a}{_ATTN[name]}.weight")
            put(kind, li, name, w.T.reshape(cfg.d_model, -1, h))
        put(kind, li, "wo", get(a + "o_proj.weight").T.reshape(n, h, cfg.d_model))
        put(kind, li, "q_norm", get(a + "q_norm.weight"))
        put(kind, li, "k_norm", get(a + "k_norm.weight"))
    params: Params = {"embedding": get("model.embed_tokens.weight").astype(dtype)}
    params["final_norm"] = get("model.norm.weight").astype(dtype)
    if not cfg.tie_embeddings:
        params["lm_head"] = get("lm_head.weight").T.astype(dtype)
    if cfg.layers_of("attention"):
        params["layers"] = stacks["attention"]
    if cfg.layers_of("gdn"):
        params["gdn_layers"] = stacks["gdn"]
    return params


def qwen35_from_params(
    params: Params, cfg: ModelConfig, dtype: Any = None
) -> dict[str, np.ndarray]:
    """HF-named Qwen3.5 tensors (numpy) of single-stream params; inverse of params_from_qwen35."""
    check_exportable(cfg)
    cast = (
        (lambda a: np.ascontiguousarray(a))
        if dtype is None
        else (lambda a: np.ascontiguousarray(a).astype(np.dtype(dtype)))
    )
    out = {"model.embed_tokens.weight": cast(np.asarray(params["embedding"]))}
    stacks = {"attention": params.get("layers"), "gdn": params.get("gdn_layers")}
    for i, (kind, li) in enumerate(cfg.layer_slots()):
        pre = f"model.layers.{i}."
        p = {name: np.asarray(a[li]) for name, a in stacks[kind].items()}
        for name, hf_name in _BLOCK.items():
            out[pre + hf_name] = cast(p[name].T if name.startswith("w_") else p[name])
        if kind == "gdn":
            gdn_params = {k: v for k, v in p.items() if k.startswith("gdn_")}
            for name, value in gdn_to_hf(gdn_params, cfg).items():
                out[f"{pre}linear_attn.{name}"] = cast(value)
            continue
        a = f"{pre}self_attn."
        q = np.stack([p["wq"].transpose(1, 2, 0), p["wq_gate"].transpose(1, 2, 0)], axis=1)
        out[a + "q_proj.weight"] = cast(q.reshape(-1, cfg.d_model))
        for name in ("wk", "wv"):
            out[f"{a}{_ATTN[name]}.weight"] = cast(p[name].reshape(cfg.d_model, -1).T)
        out[a + "o_proj.weight"] = cast(p["wo"].reshape(-1, cfg.d_model).T)
        out[a + "q_norm.weight"] = cast(p["q_norm"])
        out[a + "k_norm.weight"] = cast(p["k_norm"])
    out["model.norm.weight"] = cast(np.asarray(params["final_norm"]))
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = cast(np.asarray(params["lm_head"]).T)
    return out
