"""Transformer -> Orthros conversion: the same weights plus identity query scale-offsets.

With alpha = 1 and beta = 0 both streams' queries equal the Transformer's, so for a window
w >= T the converted model computes exactly the Transformer's function; a smaller window
changes only what the base stream attends to (paper Sec. 3, App. A Table 6).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from orthros_jax.config import ModelConfig

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
    """(orthros_cfg, orthros_params) from a transformer-arm model.

    params: OrthrosLM params of cfg (numpy or jax arrays; not modified).
    window: base-stream window of the result (default: cfg.window).
    scale_offset: add identity SO vectors so_{base,out}_{scale,offset} [L, N, H] (ones /
      zeros in cfg.param_dtype); False gives the paper's "w/o SO" ablation.
    """
    if cfg.architecture != "transformer":
        raise ValueError(
            f"from_transformer needs architecture='transformer', got {cfg.architecture!r}"
        )
    layers = params.get("layers")
    if not isinstance(layers, dict):
        raise ValueError("params has no 'layers' dict: expected an OrthrosLM parameter tree")
    present = sorted(k for k in SO_KEYS if k in layers)
    if present:
        raise ValueError(f"transformer params already hold scale-offset vectors {present}")
    orthros_cfg = cfg.replace(
        architecture="orthros",
        scale_offset=scale_offset,
        window=cfg.window if window is None else window,
    )
    new_layers = dict(layers)
    if scale_offset:
        shape = (cfg.n_layers, cfg.n_heads, cfg.head_dim)
        dtype = np.dtype(cfg.param_dtype)
        for key in SO_KEYS:
            fill = np.ones if key.endswith("scale") else np.zeros
            new_layers[key] = fill(shape, dtype)
    return orthros_cfg, {**params, "layers": new_layers}
