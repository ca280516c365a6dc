"""Transformer -> Orthros and Linear Hybrid -> Orthros-H conversion: the same weights plus
identity query scale-offsets.

With alpha = 1 and beta = 0 both streams' queries equal the Transformer's, so for a window
w >= T the converted model computes exactly the Transformer's function; a smaller window
changes only what the base stream attends to (paper Sec. 3, App. A Table 6). A hybrid's GDN
layers gain identity cross-query SO [Hk, dk]; their cross query skips the conv (gdn.py), so
Orthros-H equals the hybrid exactly only where that conv is the identity on q (its last tap 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.gdn_layer import SO_NAMES as GDN_SO_KEYS

Params = dict[str, Any]
SO_KEYS: tuple[str, ...] = tuple(
    f"so_{stream}_{part}" for stream in ("base", "out") for part in ("scale", "offset")
)


def from_transformer(
    params: Params,
    cfg: ModelConfig,
    *,
    window: int | None = None,
    scale_offset: bool = True,
) -> tuple[ModelConfig, Params]:
    """(orthros_cfg, orthros_params) from a transformer-arm model, or (orthros_h_cfg, params)
    from a hybrid-arm one.

    params: OrthrosLM params of cfg (numpy or jax arrays; not modified).
    window: base-stream window of the result (default: cfg.window).
    scale_offset: add identity SO vectors so_{base,out}_{scale,offset} [layers, N, H] (and, for a
      hybrid, gdn_so_out_{scale,offset} [L_gdn, Hk, dk]) (ones / zeros in cfg.param_dtype);
      False gives the paper's "w/o SO" ablation.
    """
    target = {"transformer": "orthros", "hybrid": "orthros_h"}.get(cfg.architecture)
    if target is None:
        raise ValueError(
            "from_transformer needs architecture='transformer' (-> orthros) or 'hybrid' "
            f"(-> orthros_h), got {cfg.architecture!r}"
        )
    layers = params.get("layers")
    if not isinstance(layers, dict):
        raise ValueError("params has no 'layers' dict: expected an OrthrosLM parameter tree")
    present = sorted(k for k in SO_KEYS if k in layers)
    if present:
        raise ValueError(f"transformer params already hold scale-offset vectors {present}")
    orthros_cfg = cfg.replace(
        architecture=target,
        scale_offset=scale_offset,
        window=cfg.window if window is None else window,
    )
    new_layers = dict(layers)
    if scale_offset:
        shape = (cfg.layers_of("attention"), cfg.n_heads, cfg.head_dim)
        dtype = np.dtype(cfg.param_dtype)
        for key in SO_KEYS:
            fill = np.ones if key.endswith("scale") else np.zeros
            new_layers[key] = fill(shape, dtype)
    out = {**params, "layers": new_layers}
    if target == "orthros_h" and scale_offset:
        gdn = dict(params["gdn_layers"])
        shape = (cfg.layers_of("gdn"), cfg.gdn_num_k_heads, cfg.gdn_k_head_dim)
        for key in GDN_SO_KEYS:
            fill = np.ones if key.endswith("scale") else np.zeros
            gdn[key] = fill(shape, np.dtype(cfg.param_dtype))
        out["gdn_layers"] = gdn
    return orthros_cfg, out
