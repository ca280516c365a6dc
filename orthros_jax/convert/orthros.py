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

from orthros_jax.config import ModelConfig
from orthros_jax.config.architectures import TWO_STREAM_FORM
from orthros_jax.layers.stack import fill_identity_so, kinds_of, so_names

Params = dict[str, Any]


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
    target = TWO_STREAM_FORM.get(cfg.architecture)
    if target is None:
        raise ValueError(
            "from_transformer needs architecture='transformer' (-> orthros) or 'hybrid' "
            f"(-> orthros_h), got {cfg.architecture!r}"
        )
    if not isinstance(params.get("layers"), dict):
        raise ValueError("params has no 'layers' dict: expected an OrthrosLM parameter tree")
    orthros_cfg = cfg.replace(
        architecture=target,
        scale_offset=scale_offset,
        window=cfg.window if window is None else window,
    )
    with_so = orthros_cfg.replace(scale_offset=True)
    present = sorted(
        f"{kind.params_key}/{name}"
        for kind in kinds_of(with_so)
        for name in so_names(kind, with_so)
        if name in params.get(kind.params_key, {})
    )
    if present:
        raise ValueError(f"transformer params already hold scale-offset vectors {present}")
    if not scale_offset:
        return orthros_cfg, dict(params)
    return orthros_cfg, fill_identity_so(params, orthros_cfg)[0]
