"""flash-linear-attention (fla 0.6.0) config.json <-> ModelConfig: `model_type` "gla"
(GLAForCausalLM, our arm gla), "retnet" (RetNetForCausalLM, arm retnet) and "gated_deltanet"
(GatedDeltaNetForCausalLM, arm gdn); the tensors are fla.py's.

Every fla block is pre-RMSNorm mixer + residual, pre-RMSNorm SwiGLU + residual (d_ff = the
config's intermediate_size, or 256 * ceil(int(D * hidden_ratio * 2/3) / 256)), a final norm and
an untied head unless tie_word_embeddings. Options fla has that compute something we do not
(hybrid `attn` layers, attnres, powlu, a sigmoid or absent GDN output gate, no GDN conv,
negative eigenvalues, conv bias, l2warp) and any key fla's configs do not have are refused by
name, before any tensor is read. Options that only pick fla's kernels (attn_mode, fuse_*) are
accepted; so are the ones fla 0.6.0 reads but never uses (GLA's use_gk / use_gv, RetNet's
use_short_conv and conv_size).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orthros_jax.config import ModelConfig
from orthros_jax.config.kinds import LinearOptions
from orthros_jax.convert.common import config_with, own_arm
from orthros_jax.layers import gdn, gla, retention

# fla's model_type -> the layer kind of its pure stack (the checkpoint imports as that kind's
# own arm, common.own_arm), and back.
KIND_OF = {"gla": gla.KIND.name, "retnet": retention.KIND.name, "gated_deltanet": gdn.KIND.name}
MODEL_TYPE_OF = {kind: mt for mt, kind in KIND_OF.items()}
CLASS_OF = {
    "gla": "GLAForCausalLM",
    "retnet": "RetNetForCausalLM",
    "gated_deltanet": "GatedDeltaNetForCausalLM",
}
# Keys every fla config.json may carry that change nothing we compute (kernel choice, token ids,
# HF bookkeeping); written back with fla's defaults on export.
_NEUTRAL = {
    "architectures",
    "model_type",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "attn_mode",
    "fuse_norm",
    "fuse_swiglu",
    "fuse_cross_entropy",
    "fuse_linear_cross_entropy",
    "use_cache",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "max_position_embeddings",
    "initializer_range",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
}
_SHAPES = {
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "norm_eps",
    "hidden_ratio",
    "intermediate_size",
    "hidden_act",
    "tie_word_embeddings",
    "attn",
    "attnres_block_size",
    "use_l2warp",
}
_KEYS = {
    "gla": {
        "expand_k",
        "expand_v",
        "num_heads",
        "num_kv_heads",
        "feature_map",
        "use_short_conv",
        "conv_size",
        "use_output_gate",
        "clamp_min",
        "elementwise_affine",
        "use_gk",
        "use_gv",
    },
    "retnet": {
        "expand_k",
        "expand_v",
        "num_heads",
        "num_kv_heads",
        "feature_map",
        "use_short_conv",
        "conv_size",
        "use_output_gate",
        "elementwise_affine",
    },
    "gated_deltanet": {
        "expand_v",
        "use_gate",
        "use_short_conv",
        "allow_neg_eigval",
        "conv_size",
        "head_dim",
        "num_heads",
        "num_v_heads",
        "output_gate_activation",
    },
}
# (key, the only value we compute, why) for options that would change the function.
_MUST: dict[str, list[tuple[str, Any, str]]] = {
    "all": [
        ("attn", None, "fla's hybrid attention layers are not mapped"),
        ("attnres_block_size", None, "attention residuals are not implemented"),
        ("hidden_act", "swish", "only the SwiGLU FFN / swish gate is implemented"),
        ("use_l2warp", False, "l2warp changes the training loss"),
    ],
    "gla": [],
    "retnet": [],
    "gated_deltanet": [
        ("use_gate", True, "our GDN always has its output gate"),
        ("use_short_conv", True, "our GDN always has its short conv"),
        ("allow_neg_eigval", False, "beta in (0, 2) is not implemented"),
    ],
}


def is_fla(hf: Mapping[str, Any]) -> bool:
    """Whether a config.json dict is one of fla's three supported model types."""
    return str(hf.get("model_type") or "") in KIND_OF


def d_ff_of(hf: Mapping[str, Any]) -> int:
    """fla's GatedMLP width: intermediate_size, or 256 * ceil(int(D * ratio * 2/3) / 256)."""
    if hf.get("intermediate_size") is not None:
        return int(hf["intermediate_size"])
    ratio = 4 if hf.get("hidden_ratio") is None else hf["hidden_ratio"]
    return 256 * math.ceil(int(int(hf["hidden_size"]) * ratio * 2 / 3) / 256)


def _check(hf: Mapping[str, Any]) -> str:
    mt = str(hf.get("model_type") or "")
    if mt not in KIND_OF:
        raise ValueError(f"fla model_type {mt!r} is unsupported; supported: {sorted(KIND_OF)}")
    unknown = sorted(set(hf) - _NEUTRAL - _SHAPES - _KEYS[mt])
    if unknown:
        raise ValueError(f"unsupported fla {mt} config option(s) {unknown}")
    for key, want, why in _MUST["all"] + _MUST[mt]:
        value = hf.get(key, want)
        if value != want:
            raise ValueError(
                f"unsupported fla {mt} option {key}={value!r} (expected {want!r}: {why})"
            )
    if mt == "gated_deltanet":
        act = hf.get("output_gate_activation", "swish")
        if act not in ("swish", "silu"):
            raise ValueError(
                f"unsupported fla gated_deltanet option output_gate_activation={act!r}"
                " (expected 'swish': our GDN's output gate is SiLU)"
            )
    return mt


def _per_head(total: float, heads: int, what: str) -> int:
    if not math.isclose(total, round(total)) or round(total) % heads:
        raise ValueError(f"fla {what}={total} must be an integer divisible by num_heads={heads}")
    return round(total) // heads


def config_from_fla(hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """ModelConfig of an fla config.json dict (the checkpoint's own arm); ValueError naming any
    option we do not compute."""
    mt = _check(hf)
    d = int(hf.get("hidden_size", 2048))
    fields: dict[str, Any] = dict(
        architecture=own_arm(KIND_OF[mt]),
        vocab_size=int(hf.get("vocab_size", 32000)),
        d_model=d,
        n_layers=int(hf.get("num_hidden_layers", 24)),
        d_ff=d_ff_of({"hidden_size": d, **hf}),
        norm_eps=float(hf.get("norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(hf.get("initializer_range", 0.02)),
    )
    if mt == "gated_deltanet":
        hk, dk = int(hf.get("num_heads", 6)), int(hf.get("head_dim", 256))
        hv = int(hf.get("num_v_heads") or hk)
        dv = hf.get("expand_v", 2.0) * dk
        if not math.isclose(dv, round(dv)) or hv < hk or hv % hk:
            raise ValueError(
                f"fla gated_deltanet: head_dim * expand_v = {dv} must be an integer "
                f"and num_v_heads={hv} a multiple of num_heads={hk}"
            )
        fields["kinds"] = {
            gdn.KIND.name: dict(
                num_k_heads=hk,
                num_v_heads=hv,
                k_head_dim=dk,
                v_head_dim=round(dv),
                conv_kernel=int(hf.get("conv_size", 4)),
            )
        }
    else:
        p = KIND_OF[mt]
        is_gla = p == gla.KIND.name
        n = int(hf.get("num_heads", 4 if is_gla else 8))
        kv = int(hf.get("num_kv_heads") or n)
        ek = hf.get("expand_k", 0.5 if is_gla else 1.0)
        ev = hf.get("expand_v", 1.0 if is_gla else 2.0)
        options: dict[str, Any] = {
            "heads": n,
            "kv_heads": kv,
            "k_head_dim": _per_head(d * ek, n, "hidden_size * expand_k"),
            "v_head_dim": _per_head(d * ev, n, "hidden_size * expand_v"),
            "feature_map": hf.get("feature_map"),
            "output_gate": bool(hf.get("use_output_gate", True)),
            "norm_affine": bool(hf.get("elementwise_affine", True)),
        }
        if is_gla:
            cm = hf.get("clamp_min")
            options.update(
                short_conv=bool(hf.get("use_short_conv", False)),
                conv_kernel=int(hf.get("conv_size", 4)),
                clamp_min=None if cm is None else float(cm),
            )
        fields["kinds"] = {p: options}
    return config_with(fields, overrides)


def fla_config_from(cfg: ModelConfig, *, torch_dtype: str | None = None) -> dict[str, Any]:
    """fla's config.json for a gla / retnet / gdn model (fla's defaults for the neutral keys)."""
    check_exportable(cfg)
    p = fla_kind(cfg)
    assert p is not None  # check_exportable
    mt = MODEL_TYPE_OF[p]
    out: dict[str, Any] = {
        "architectures": [CLASS_OF[mt]],
        "model_type": mt,
        "attn": None,
        "attn_mode": "chunk",
        "attnres_block_size": None,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
        "dtype": torch_dtype or cfg.param_dtype,
        "fuse_cross_entropy": True,
        "fuse_linear_cross_entropy": False,
        "fuse_norm": True,
        "fuse_swiglu": True,
        "hidden_act": "swish",
        "hidden_ratio": 4,
        "hidden_size": cfg.d_model,
        "initializer_range": cfg.init_std,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": 2048,
        "norm_eps": cfg.norm_eps,
        "num_hidden_layers": cfg.n_layers,
        "tie_word_embeddings": cfg.tie_embeddings,
        "use_cache": True,
        "use_l2warp": False,
        "vocab_size": cfg.vocab_size,
    }
    if p == gdn.KIND.name:
        g = cfg.kinds.gdn
        out.update(
            num_heads=g.num_k_heads,
            num_v_heads=g.num_v_heads,
            head_dim=g.k_head_dim,
            expand_v=g.v_head_dim / g.k_head_dim,
            conv_size=g.conv_kernel,
            use_gate=True,
            use_short_conv=True,
            allow_neg_eigval=False,
            output_gate_activation="swish",
        )
        return out
    o = linear_options(cfg, p)
    out.update(
        num_heads=o.heads,
        num_kv_heads=o.kv_heads,
        expand_k=o.heads * o.k_head_dim / cfg.d_model,
        expand_v=o.heads * o.v_head_dim / cfg.d_model,
        feature_map=o.feature_map,
        use_output_gate=o.output_gate,
        elementwise_affine=o.norm_affine,
    )
    if p == gla.KIND.name:
        g = cfg.kinds.gla
        out.update(
            use_short_conv=g.short_conv,
            conv_size=g.conv_kernel,
            clamp_min=g.clamp_min,
            use_gk=True,
            use_gv=False,
        )
    else:
        out.update(use_short_conv=False, conv_size=4)
    return out


def linear_options(cfg: ModelConfig, kind: str) -> LinearOptions:
    """cfg's options section of a linear-attention kind (GLA, retention)."""
    o = cfg.kinds[kind]
    assert isinstance(o, LinearOptions), kind
    return o


def fla_kind(cfg: ModelConfig) -> str | None:
    """The layer kind of cfg's arm when fla has the arm (the own arm of one of KIND_OF's kinds:
    a single-stream pure stack), else None."""
    return next((k for k in MODEL_TYPE_OF if cfg.architecture == own_arm(k)), None)


def check_exportable(cfg: ModelConfig) -> None:
    """ValueError unless fla's model of cfg's arm computes exactly cfg's function."""
    if fla_kind(cfg) is None:
        names = ", ".join(own_arm(k) for k in MODEL_TYPE_OF)
        raise ValueError(f"only the {names} arms export to fla (got {cfg.architecture!r})")
    need = {"norm_zero_centered": False, "scale_offset": False}
    wrong = {k: getattr(cfg, k) for k, v in need.items() if getattr(cfg, k) != v}
    g = cfg.kinds.gla
    if fla_kind(cfg) == gla.KIND.name and (g.gate_rank, g.gate_normalizer) != (16, 16):
        wrong["kinds.gla.gate_rank/gate_normalizer"] = (g.gate_rank, g.gate_normalizer)
    if wrong:
        raise ValueError(
            f"an fla export needs {need} and fla's fixed GLA gate (rank 16, "
            f"normalizer 16); this config has {wrong}"
        )
