"""LoRA adapters in `peft`'s format (adapter_config.json + adapter_model.safetensors), for the
Llama / Qwen3-shaped models of hf_weights.py; no torch or peft needed here.

peft's LoRA on a Linear W_hf [out, in] adds (lora_alpha / r) lora_B [out, r] @ lora_A [r, in].
Our adapter on W [*in, *out] (layers/lora.py) is A [*in, r], B [r, *out], and every mapping of
hf_weights.py is W_hf = W.reshape(in, out).T (heads flattened, no permutation: both sides use
rotate-half RoPE), so lora_A = A.reshape(in, r).T and lora_B = B.reshape(r, out).T exactly.

  export_peft(directory, cfg, params)       the adapters of (cfg, params), next to the base
  import_peft(directory, cfg, params)       (cfg with lora, params with the adapters) of a peft
                                            adapter on an imported model (load_hf)
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from orthros_jax.config import ModelConfig
from orthros_jax.config.lora import LoRAOptions
from orthros_jax.convert.hf_weights import _LAYER_NAMES
from orthros_jax.layers import lora
from orthros_jax.layers.registry import kinds_of

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model.model.layers."
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(.+)\.lora_([AB])\.weight$")
# our projection name -> its transformers module path under model.layers.{i}. ("self_attn.q_proj")
MODULES = {ours: hf.removesuffix(".weight") for ours, hf in _LAYER_NAMES.items()}
Params = dict[str, Any]


def _stack_key(cfg: ModelConfig) -> str:
    """The params key of the one kind a Llama / Qwen3 model has (attention)."""
    kinds = kinds_of(cfg)
    if len(kinds) != 1 or cfg.two_streams or cfg.moe is not None:
        raise ValueError(
            f"peft adapters are exported for Llama / Qwen3-shaped models (one attention kind, "
            f"single stream, dense), not architecture={cfg.architecture!r}, "
            f"layer_types={cfg.layer_types!r}"
        )
    return kinds[0].params_key


def export_peft(
    directory: str, cfg: ModelConfig, params: Params, base_model: str = ""
) -> list[str]:
    """Writes cfg.lora's adapters of params in peft's format into directory (next to the base
    model export_hf wrote there); returns the files written."""
    if cfg.lora is None:
        raise ValueError("export_peft: the model has no LoRA adapters (model.lora is None)")
    key = _stack_key(cfg)
    _, adapters = lora.split(params, cfg)
    r, tensors, modules = cfg.lora.rank, {}, []
    for name_a, a in adapters[key].items():
        if not name_a.endswith(lora.A_SUFFIX):
            continue
        name = name_a.removesuffix(lora.A_SUFFIX)
        if name not in MODULES:
            raise ValueError(f"export_peft: the adapter on {name!r} has no transformers module")
        modules.append(MODULES[name].rsplit(".", 1)[-1])
        a_np = np.asarray(a, np.float32)
        b_np = np.asarray(adapters[key][name + lora.B_SUFFIX], np.float32)
        for i in range(cfg.n_layers):
            pre = f"{_PREFIX}{i}.{MODULES[name]}"
            tensors[f"{pre}.lora_A.weight"] = np.ascontiguousarray(a_np[i].reshape(-1, r).T)
            tensors[f"{pre}.lora_B.weight"] = np.ascontiguousarray(b_np[i].reshape(r, -1).T)
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model or None,
        "r": r,
        "lora_alpha": cfg.lora.alpha,
        "lora_dropout": cfg.lora.dropout,
        "target_modules": sorted(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    with open(os.path.join(directory, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    return [ADAPTER_WEIGHTS, ADAPTER_CONFIG]


def _read_config(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, ADAPTER_CONFIG)
    if not os.path.isfile(path) or not os.path.isfile(os.path.join(directory, ADAPTER_WEIGHTS)):
        raise ValueError(f"{directory!r} has no {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} (peft)")
    with open(path) as f:
        conf = json.load(f)
    unsupported = {
        "peft_type": (conf.get("peft_type"), "LORA"),
        "bias": (conf.get("bias", "none"), "none"),
        "use_rslora": (conf.get("use_rslora", False), False),
        "use_dora": (conf.get("use_dora", False), False),
        "fan_in_fan_out": (conf.get("fan_in_fan_out", False), False),
    }
    for field, (got, want) in unsupported.items():
        if got != want:
            raise ValueError(f"peft adapter {path}: {field}={got!r} is unsupported (only {want!r})")
    if conf.get("modules_to_save"):
        raise ValueError(
            f"peft adapter {path}: modules_to_save={conf['modules_to_save']!r} is unsupported"
        )
    return conf


def import_peft(directory: str, cfg: ModelConfig, params: Params) -> tuple[ModelConfig, Params]:
    """(cfg with lora, params with the adapters) of the peft LoRA adapter in directory on the
    imported model (cfg, params). ValueError naming the module or tensor, before any weight is
    used: a module the model lacks, a layer beyond it, a shape that does not fit, a rank <= 0."""
    key = _stack_key(cfg)
    conf = _read_config(directory)
    # adapter_config.json's values as read; LoRAOptions checks them (one-line errors by name).
    r: Any = conf.get("r")
    alpha: Any = conf.get("lora_alpha")
    by_module = {path: ours for ours, path in MODULES.items()}
    found: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    with safe_open(os.path.join(directory, ADAPTER_WEIGHTS), framework="numpy") as f:
        for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            m = _KEY.match(name)
            if m is None or m.group(2) not in by_module:
                raise ValueError(f"peft adapter tensor {name!r}: no such module in the model")
            layer, ours = int(m.group(1)), by_module[m.group(2)]
            if layer >= cfg.n_layers:
                raise ValueError(
                    f"peft adapter tensor {name!r}: the model has {cfg.n_layers} layers"
                )
            found.setdefault(ours, {}).setdefault(layer, {})[m.group(3)] = f.get_tensor(name)
    options = LoRAOptions(
        rank=r, alpha=alpha, dropout=conf.get("lora_dropout", 0.0), targets=tuple(found)
    )
    new_cfg = cfg.replace(lora=options)  # checks each target is a projection the kind declares
    decls = lora.adapter_decls(kinds_of(new_cfg)[0].params(new_cfg), new_cfg)
    stack = {}
    for ours, layers in found.items():
        shape_a, shape_b = decls[ours + lora.A_SUFFIX].shape, decls[ours + lora.B_SUFFIX].shape
        want = {"A": (r, int(np.prod(shape_a[:-1]))), "B": (int(np.prod(shape_b[1:])), r)}
        a_all = np.empty((cfg.n_layers, *shape_a), np.float32)
        b_all = np.empty((cfg.n_layers, *shape_b), np.float32)
        for i in range(cfg.n_layers):
            got = layers.get(i, {})
            for part in "AB":
                t = got.get(part)
                if t is None or tuple(t.shape) != want[part]:
                    where = f"{_PREFIX}{i}.{MODULES[ours]}.lora_{part}.weight"
                    shape = "missing" if t is None else tuple(t.shape)
                    raise ValueError(
                        f"peft adapter tensor {where}: got {shape}, expected {want[part]}"
                    )
            a_all[i] = got["A"].astype(np.float32).T.reshape(shape_a)
            b_all[i] = got["B"].astype(np.float32).T.reshape(shape_b)
        dtype = np.dtype(cfg.param_dtype)
        stack[ours + lora.A_SUFFIX], stack[ours + lora.B_SUFFIX] = (
            a_all.astype(dtype),
            b_all.astype(dtype),
        )
    return new_cfg, lora.join(params, {key: stack})
