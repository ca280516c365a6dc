"""The retention layer kind (arm "retnet"): fla's MultiScaleRetention (layers/
multiscale_retention.py of flash-linear-attention) inside the shared block.

The mixer is layers/linear_mixer.py without a conv, with rotary on q and k (rotate-half over
the whole key head dim, base 10000, at each token's position) and a fixed decay per head,
gamma_n = 1 - 2^(-5-n). Per-layer parameters (under "retention_layers"): the shared block,
linear_mixer.param_shapes(spec) (retention_wq, retention_wk, retention_wv, retention_out; retention_wg with the output gate,
retention_norm with norm_affine), and retention_so_out_scale / retention_so_out_offset [N, H] (orthros_h with
scale_offset).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.layers import linear_kind
from orthros_jax.layers import linear_mixer as lm
from orthros_jax.layers.kind import Initializer, ParamSpec, default_init, residual_std


def spec(cfg: ModelConfig) -> lm.Spec:
    """The retention mixer's spec from cfg's retention_* fields."""
    return lm.Spec(
        prefix="retention", heads=cfg.retention_heads, kv_heads=cfg.retention_kv_heads, k_dim=cfg.retention_k_head_dim,
        v_dim=cfg.retention_v_head_dim, feature_map=cfg.retention_feature_map,
        output_gate=cfg.retention_output_gate, norm_affine=cfg.retention_norm_affine, chunk=cfg.retention_chunk,
        rotary=True, norm_eps=cfg.norm_eps,
    )  # fmt: skip


def mixer_param_shapes(cfg: ModelConfig) -> dict[str, ParamSpec]:
    """Every per-layer retention mixer parameter (no layers axis, no SO), with logical axes."""
    return lm.param_shapes(spec(cfg), cfg.d_model)


def decay_fn(cfg: ModelConfig) -> lm.DecayFn:
    """The fixed log decays [N]: log(1 - 2^(-5-n))."""
    log_gamma = jnp.log1p(-(2.0 ** (-5.0 - jnp.arange(cfg.retention_heads, dtype=jnp.float32))))
    return lambda p, h: log_gamma


def init_for(name: str, cfg: ModelConfig) -> Initializer:
    """fla's init: projections ~ N(0, init_std), the norm 1; retention_out depth-scaled."""
    if name == "retention_norm":
        return jax.nn.initializers.ones
    if name == "retention_out":
        return jax.nn.initializers.normal(residual_std(cfg))
    return default_init(name, cfg)


def validate(cfg: ModelConfig) -> None:
    """Rotary rotates pairs: an even key head dim."""
    if cfg.retention_k_head_dim % 2:
        raise ValueError(
            f"ModelConfig.retention_k_head_dim={cfg.retention_k_head_dim} must be even (rotary "
            "pairs)"
        )


KIND = linear_kind.make(
    "retention", spec, decay_fn, mixer_param_shapes, init_for, validate, lambda cfg: 0
)
