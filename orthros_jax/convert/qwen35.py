"""Hugging Face Qwen3.5 (text, `Qwen3_5ForCausalLM`) tensors <-> single-stream params (the
config: qwen35_config.py).

Attention layers: q_proj holds, per head, the query then the sigmoid output gate ([N * 2H, D]
-> wq, wq_gate [D, N, H]); k/v/o_proj, q/k_norm as Qwen3's. GDN layers (linear_attn.*) map
through gdn_hf; the norms are zero-centred RMSNorms (scale 1 + w), stored as HF stores them.
The FFN is a dense SwiGLU here; the mixture-of-experts variant (Qwen3_5MoeForCausalLM,
qwen35_moe.py) reuses everything else with its own FFN tensors (the `ffn=` shapes below, and
cfg.moe leaving the FFN out). Tensors are read under the text model's names (TextTensors: a
multimodal checkpoint's `model.language_model.` prefix stripped, its `mtp.*` /
`model.visual.*` tensors left out, as transformers' loader does for Qwen3_5*ForCausalLM).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.convert.gdn_hf import HF_NAMES as GDN_HF_NAMES
from orthros_jax.convert.gdn_hf import gdn_to_hf, hf_tensor_shapes, hf_to_gdn
from orthros_jax.convert.hf_weights import _shape_of
from orthros_jax.convert.qwen35_config import ATTENTION, GDN, check_exportable
from orthros_jax.layers.registry import KINDS

_NORMS = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight"}
_DENSE_FFN = {
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
_BLOCK = _NORMS | _DENSE_FFN  # the shared block's HF names (remote.py's too)
# A multimodal checkpoint's text-model prefix, and the tensors a text model ignores.
_TEXT_PREFIX, _NOT_TEXT = "model.language_model.", ("mtp.", "model.visual.")
_ATTN = {"wk": "k_proj", "wv": "v_proj", "wo": "o_proj", "q_norm": "q_norm", "k_norm": "k_norm"}
Params = dict[str, Any]
FFNShapes = Callable[[int], Mapping[str, tuple[int, ...]]]


def dense_ffn_shapes(cfg: ModelConfig) -> FFNShapes:
    """Layer i's FFN tensors (names under model.layers.{i}.) with their shapes: Qwen3.5's dense
    SwiGLU of width d_ff in every layer."""
    d, f = cfg.d_model, cfg.d_ff
    shapes = {"w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}
    return lambda i: {_DENSE_FFN[name]: s for name, s in shapes.items()}


def qwen35_tensor_shapes(
    cfg: ModelConfig, ffn: FFNShapes | None = None
) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of a Qwen3.5 checkpoint of cfg, with its shape; ffn gives layer
    i's FFN tensors (default dense_ffn_shapes)."""
    d, n, k, h, v = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size
    ffn = ffn or dense_ffn_shapes(cfg)
    gdn_shapes = hf_tensor_shapes(cfg)
    attn_shapes: dict[str, tuple[int, ...]] = {
        "q_proj": (2 * n * h, d),
        "k_proj": (k * h, d),
        "v_proj": (k * h, d),
        "o_proj": (d, n * h),
        "q_norm": (h,),
        "k_norm": (h,),
    }
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, d)}
    for i, (kind, _) in enumerate(cfg.layer_slots()):
        pre = f"model.layers.{i}."
        out.update({pre + hf_name: (d,) for hf_name in _NORMS.values()})
        out.update({pre + name: s for name, s in ffn(i).items()})
        if kind == GDN:
            out.update({f"{pre}linear_attn.{name}": s for name, s in gdn_shapes.items()})
        else:
            out.update({f"{pre}self_attn.{name}.weight": s for name, s in attn_shapes.items()})
    out["model.norm.weight"] = (d,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (v, d)
    return out


class TextTensors(Mapping[str, Any]):
    """A Qwen3.5 checkpoint's tensors under the text model's names: `model.language_model.X`
    (a multimodal checkpoint's prefix) read as `model.X`, `mtp.*` (multi-token prediction) and
    `model.visual.*` left out, as transformers' loader does for Qwen3_5*ForCausalLM."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self._tensors = tensors
        self._source: dict[str, str] = {}
        for name in tensors:
            if name.startswith(_NOT_TEXT):
                continue
            ours = (
                "model." + name.removeprefix(_TEXT_PREFIX)
                if name.startswith(_TEXT_PREFIX)
                else name
            )
            if ours in self._source:
                raise ValueError(
                    f"tensor {ours!r} is stored twice ({self._source[ours]!r}, {name!r})"
                )
            self._source[ours] = name

    def shape(self, name: str) -> tuple[int, ...]:
        return _shape_of(self._tensors, self._source[name])

    def __getitem__(self, name: str) -> Any:
        return self._tensors[self._source[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._source)

    def __len__(self) -> int:
        return len(self._source)


def _check_tensors(tensors: Mapping[str, Any], cfg: ModelConfig, ffn: FFNShapes | None) -> None:
    want = qwen35_tensor_shapes(cfg, ffn)
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
        got = _shape_of(tensors, name)
        if tuple(got) != shape:
            raise ValueError(f"tensor {name!r} has shape {list(got)}; expected {list(shape)}")


def params_from_qwen35(
    tensors: Mapping[str, Any], cfg: ModelConfig, dtype: Any = None, ffn: FFNShapes | None = None
) -> Params:
    """Single-stream params (numpy) of cfg from HF-named Qwen3.5 tensors (read as TextTensors),
    validated first against qwen35_tensor_shapes(cfg, ffn). The dense FFN goes into the kinds'
    stacks; with cfg.moe no FFN tensor is read (qwen35_moe maps them)."""
    tensors = TextTensors(tensors)
    _check_tensors(tensors, cfg, ffn)
    dtype = np.dtype(dtype or cfg.param_dtype)
    n, h = cfg.n_heads, cfg.head_dim
    get = lambda name: np.asarray(tensors[name], np.float32)
    stacks: dict[str, dict[str, np.ndarray]] = {ATTENTION: {}, GDN: {}}
    block = _NORMS if cfg.moe is not None else _BLOCK

    def put(kind: str, li: int, name: str, value: np.ndarray) -> None:
        stack = stacks[kind]
        if name not in stack:
            stack[name] = np.empty((cfg.layers_of(kind), *value.shape), dtype)
        stack[name][li] = value

    for i, (kind, li) in enumerate(cfg.layer_slots()):
        pre = f"model.layers.{i}."
        for name, hf_name in block.items():
            put(
                kind,
                li,
                name,
                get(pre + hf_name).T if name.startswith("w_") else get(pre + hf_name),
            )
        if kind == GDN:
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
    for kind, stack in stacks.items():
        if cfg.layers_of(kind):
            params[KINDS[kind].params_key] = stack
    return params


def qwen35_from_params(
    params: Params, cfg: ModelConfig, dtype: Any = None
) -> dict[str, np.ndarray]:
    """HF-named Qwen3.5 tensors (numpy) of single-stream params; inverse of params_from_qwen35
    (with cfg.moe without the FFN tensors, which qwen35_moe adds)."""
    check_exportable(cfg)
    cast = (
        (lambda a: np.ascontiguousarray(a))
        if dtype is None
        else (lambda a: np.ascontiguousarray(a).astype(np.dtype(dtype)))
    )
    out = {"model.embed_tokens.weight": cast(np.asarray(params["embedding"]))}
    stacks = {kind: params.get(KINDS[kind].params_key, {}) for kind in (ATTENTION, GDN)}
    block = _NORMS if cfg.moe is not None else _BLOCK
    for i, (kind, li) in enumerate(cfg.layer_slots()):
        pre = f"model.layers.{i}."
        p = {name: np.asarray(a[li]) for name, a in stacks[kind].items()}
        for name, hf_name in block.items():
            out[pre + hf_name] = cast(p[name].T if name.startswith("w_") else p[name])
        if kind == GDN:
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
