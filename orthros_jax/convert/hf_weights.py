"""Safetensors I/O (no torch) and the Llama/Qwen3 <-> OrthrosLM tensor mapping.

Reading is lazy: `SafetensorsCheckpoint` maps tensor names to files through the headers
(single `model.safetensors` or sharded with `model.safetensors.index.json`), so names and
shapes are validated before any weight is read and each tensor is read once, straight into a
preallocated stacked [layers, ...] array. bfloat16 comes back as an `ml_dtypes` numpy array.

HF Linear weights are [out, in] and act as x @ W.T; ours are [in, ...out] and act as x @ W:
  q_proj [N*H, D] -> wq [D, N, H]     k_proj/v_proj [K*H, D] -> wk/wv [D, K, H]
  o_proj [D, N*H] -> wo [N, H, D]     gate/up_proj [F, D] -> w_gate/w_up [D, F]
  down_proj [D, F] -> w_down [F, D]   lm_head [V, D] -> lm_head [D, V]
Both sides use the rotate-half RoPE layout, so q/k need no permutation.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from orthros_jax.config import ModelConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Buffers some older checkpoints saved; they are recomputed, never loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
Params = dict[str, Any]
FLOAT_TAGS = ("F64", "F32", "BF16", "F16")


class SafetensorsCheckpoint(Mapping[str, np.ndarray]):
    """Read-only {name: array} view of a HF directory's safetensors files, read on access."""

    def __init__(self, hf_dir: str) -> None:
        self.hf_dir = hf_dir
        self._handles: dict[str, Any] = {}
        single, index = os.path.join(hf_dir, SINGLE_FILE), os.path.join(hf_dir, INDEX_FILE)
        if os.path.isfile(single):  # transformers prefers the single file too
            files = {SINGLE_FILE: None}
        elif os.path.isfile(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index!r} has no 'weight_map' {{tensor name: shard file}}")
            files = {name: None for name in sorted(set(weight_map.values()))}
            absent = [n for n in files if not os.path.isfile(os.path.join(hf_dir, n))]
            if absent:
                raise ValueError(f"{index!r} names shard file(s) {absent} that do not exist")
        else:
            present = sorted(os.listdir(hf_dir)) if os.path.isdir(hf_dir) else []
            raise ValueError(
                f"{hf_dir!r} has neither {SINGLE_FILE} nor {INDEX_FILE} (found {present}); "
                "only safetensors checkpoints are read — re-save .bin weights with "
                "save_pretrained(..., safe_serialization=True)"
            )
        self._file_of: dict[str, str] = {}
        self._info: dict[str, tuple[tuple[int, ...], str]] = {}
        for name in files:
            handle = self._handle(name)
            for key in handle.keys():
                if key in self._file_of:
                    raise ValueError(
                        f"tensor {key!r} is stored twice ({self._file_of[key]}, {name})"
                    )
                sl = handle.get_slice(key)
                self._file_of[key] = name
                self._info[key] = (tuple(sl.get_shape()), sl.get_dtype())

    def _handle(self, file: str) -> Any:
        if file not in self._handles:
            self._handles[file] = safe_open(os.path.join(self.hf_dir, file), framework="numpy")
        return self._handles[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info[name][0]

    def dtype(self, name: str) -> str:
        """The safetensors dtype tag ('F32', 'BF16', ...)."""
        return self._info[name][1]

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._file_of:
            raise KeyError(name)
        return self._handle(self._file_of[name]).get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)


def write_safetensors(
    directory: str, tensors: Mapping[str, np.ndarray], max_shard_bytes: int | None = None
) -> list[str]:
    """Writes tensors as model.safetensors, or as shards + index when they exceed
    max_shard_bytes (the HF layout). Returns the file names written."""
    os.makedirs(directory, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        if max_shard_bytes and shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    meta = {"format": "pt"}  # transformers refuses files without a known format tag
    if len(shards) == 1:
        save_file(shards[0], os.path.join(directory, SINGLE_FILE), metadata=meta)
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for file, shard in zip(names, shards, strict=True):
        save_file(shard, os.path.join(directory, file), metadata=meta)
        weight_map.update({k: file for k in shard})
    total = sum(a.nbytes for shard in shards for a in shard.values())
    with open(os.path.join(directory, INDEX_FILE), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return [*names, INDEX_FILE]


# ------------------------------------------------------------------------- name mapping

# Per-layer tensors: our name -> (HF name under model.layers.{i}.).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "embedding": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}


def _layouts(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], Callable, Callable]]:
    """our name -> (HF shape, hf->ours, ours->hf) for every tensor of cfg (no leading L)."""
    d, n, k, h, f, v = (
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.d_ff,
        cfg.vocab_size,
    )
    same = (lambda a: a, lambda a: a)
    t = (lambda a: a.T, lambda a: a.T)
    heads = lambda m: (lambda a: a.T.reshape(d, m, h), lambda a: a.reshape(d, m * h).T)
    out = {
        "embedding": ((v, d), *same),
        "final_norm": ((d,), *same),
        "attn_norm": ((d,), *same),
        "mlp_norm": ((d,), *same),
        "wq": ((n * h, d), *heads(n)),
        "wk": ((k * h, d), *heads(k)),
        "wv": ((k * h, d), *heads(k)),
        "wo": ((d, n * h), lambda a: a.T.reshape(n, h, d), lambda a: a.reshape(n * h, d).T),
        "w_gate": ((f, d), *t),
        "w_up": ((f, d), *t),
        "w_down": ((d, f), *t),
    }
    if cfg.qk_norm:
        out["q_norm"] = ((h,), *same)
        out["k_norm"] = ((h,), *same)
    if not cfg.tie_embeddings:
        out["lm_head"] = ((v, d), *t)
    return out


def _layer_keys(cfg: ModelConfig) -> list[str]:
    return [k for k in _LAYER_NAMES if k in _layouts(cfg)]


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name a checkpoint of cfg holds, with its shape, in HF's order."""
    lay = _layouts(cfg)
    names = {_GLOBAL_NAMES["embedding"]: lay["embedding"][0]}
    for i in range(cfg.n_layers):
        for key in _layer_keys(cfg):
            names[f"model.layers.{i}.{_LAYER_NAMES[key]}"] = lay[key][0]
    names[_GLOBAL_NAMES["final_norm"]] = lay["final_norm"][0]
    if not cfg.tie_embeddings:
        names[_GLOBAL_NAMES["lm_head"]] = lay["lm_head"][0]
    return names


def _shape_of(tensors: Mapping[str, Any], name: str) -> tuple[int, ...]:
    if hasattr(tensors, "shape"):  # SafetensorsCheckpoint or a view of one: header only
        return tuple(tensors.shape(name))
    return tuple(np.shape(tensors[name]))


def check_hf_tensors(tensors: Mapping[str, Any], cfg: ModelConfig) -> None:
    """Raises ValueError naming missing/unexpected tensors or the first shape mismatch."""
    expected = hf_tensor_shapes(cfg)
    found = {n for n in tensors if not n.endswith(IGNORED_SUFFIXES)}
    head = _GLOBAL_NAMES["lm_head"]
    if cfg.tie_embeddings and head in found:
        found.discard(head)  # some tied checkpoints store the head anyway; checked below
    missing, extra = sorted(set(expected) - found), sorted(found - set(expected))
    kind = "Qwen3 (q/k norm)" if cfg.qk_norm else "Llama"
    tied = "tied" if cfg.tie_embeddings else "untied"
    if missing:
        raise ValueError(
            f"checkpoint is missing {len(missing)} tensor(s) a {kind} model with "
            f"{cfg.n_layers} layers and {tied} embeddings needs: {missing[:8]}"
            + (" ..." if len(missing) > 8 else "")
        )
    if extra:
        raise ValueError(
            f"checkpoint has {len(extra)} unexpected tensor(s) for a {kind} model with "
            f"{cfg.n_layers} layers and {tied} embeddings: {extra[:8]}"
            + (" ..." if len(extra) > 8 else "")
        )
    for name, shape in expected.items():
        got = _shape_of(tensors, name)
        if got != shape:
            raise ValueError(f"tensor {name!r} has shape {list(got)}; expected {list(shape)}")
        if isinstance(tensors, SafetensorsCheckpoint) and tensors.dtype(name) not in FLOAT_TAGS:
            raise ValueError(
                f"tensor {name!r} has dtype {tensors.dtype(name)}; expected one of {FLOAT_TAGS} "
                "(quantized checkpoints are not supported)"
            )
    if cfg.tie_embeddings and head in tensors:
        if not np.array_equal(
            np.asarray(tensors[head]), np.asarray(tensors[_GLOBAL_NAMES["embedding"]])
        ):
            raise ValueError(
                f"config ties embeddings but {head!r} differs from the embedding; expected "
                "tie_word_embeddings=False for a separate head"
            )


def params_from_hf(tensors: Mapping[str, Any], cfg: ModelConfig, dtype: Any = None) -> Params:
    """OrthrosLM params (transformer arm, numpy) from HF-named tensors, validated first.

    dtype: parameter dtype (default cfg.param_dtype); bf16 weights upcast exactly to fp32.
    """
    check_hf_tensors(tensors, cfg)
    dtype = np.dtype(dtype or cfg.param_dtype)
    lay = _layouts(cfg)
    params: Params = {"layers": {}}
    for key in ("embedding", "final_norm", "lm_head"):
        if key in lay:
            params[key] = np.asarray(lay[key][1](np.asarray(tensors[_GLOBAL_NAMES[key]])), dtype)
    for key in _layer_keys(cfg):
        shape, to_ours, _ = lay[key]
        stacked = None
        for i in range(cfg.n_layers):
            value = to_ours(np.asarray(tensors[f"model.layers.{i}.{_LAYER_NAMES[key]}"]))
            if stacked is None:
                stacked = np.empty((cfg.n_layers, *value.shape), dtype)
            stacked[i] = value
        params["layers"][key] = stacked
    return params


def hf_from_params(params: Params, cfg: ModelConfig, dtype: Any = None) -> dict[str, np.ndarray]:
    """HF-named tensors (numpy, HF order) from transformer-arm params; inverse of params_from_hf.

    dtype: tensor dtype to write (default: each parameter's own dtype).
    """
    lay = _layouts(cfg)
    cast = (lambda a: a) if dtype is None else (lambda a: a.astype(np.dtype(dtype)))
    out: dict[str, np.ndarray] = {}
    layers = params["layers"]
    glob = lambda key: cast(lay[key][2](np.asarray(params[key])))
    out[_GLOBAL_NAMES["embedding"]] = glob("embedding")
    for i in range(cfg.n_layers):
        for key in _layer_keys(cfg):
            value = lay[key][2](np.asarray(layers[key][i]))
            out[f"model.layers.{i}.{_LAYER_NAMES[key]}"] = cast(value)
    out[_GLOBAL_NAMES["final_norm"]] = glob("final_norm")
    if not cfg.tie_embeddings:
        out[_GLOBAL_NAMES["lm_head"]] = glob("lm_head")
    return out
