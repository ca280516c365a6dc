"""The GLA layer kind: fla's GatedLinearAttention (layers/gla.py of flash-linear-attention)
inside the shared block (pre-norms + SwiGLU FFN).

The mixer is layers/linear_mixer.py with a decay per key dim from a low-rank gate on the
un-convolved input: gk = logsigmoid(h W1 [D, R] W2 [R, K, H] + b [K, H]) / normalizer, then
max(gk, clamp_min) when set (fla: gate_low_rank_dim 16, gate_logit_normalizer 16). Per-layer
parameters (the stack adds a leading layers axis, under "gla_layers"): the shared block,
linear_mixer.param_shapes(spec) (gla_wq, gla_wk, gla_wv, gla_out; gla_wg with the output gate,
gla_norm with norm_affine, gla_conv_q/k/v with the short conv), gla_wgk1 [D, R], gla_wgk2
[R, K, H], gla_bgk [K, H], and gla_so_out_scale / gla_so_out_offset [N, H] (orthros_h with
scale_offset: the cross query's SO).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthros_jax.axes import EMBED, HEAD_DIM, KV_HEADS
from orthros_jax.config import ModelConfig
from orthros_jax.layers import linear_kind
from orthros_jax.layers import linear_mixer as lm
from orthros_jax.layers.kind import Initializer, Params, ParamSpec, default_init, residual_std


def spec(cfg: ModelConfig) -> lm.Spec:
    """The GLA mixer's spec from cfg's gla_* fields."""
    return lm.Spec(
        prefix="gla", heads=cfg.gla_heads, kv_heads=cfg.gla_kv_heads, k_dim=cfg.gla_k_head_dim,
        v_dim=cfg.gla_v_head_dim, feature_map=cfg.gla_feature_map,
        output_gate=cfg.gla_output_gate, norm_affine=cfg.gla_norm_affine, chunk=cfg.gla_chunk,
        conv_kernel=cfg.gla_conv_kernel if cfg.gla_short_conv else 0, norm_eps=cfg.norm_eps,
    )  # fmt: skip


def mixer_param_shapes(cfg: ModelConfig) -> dict[str, ParamSpec]:
    """Every per-layer GLA mixer parameter (no layers axis, no SO), with logical axes."""
    d, r, k, h = cfg.d_model, cfg.gla_gate_rank, cfg.gla_kv_heads, cfg.gla_k_head_dim
    shapes = lm.param_shapes(spec(cfg), d)
    shapes["gla_wgk1"] = ((d, r), (EMBED, None))
    shapes["gla_wgk2"] = ((r, k, h), (None, KV_HEADS, HEAD_DIM))
    shapes["gla_bgk"] = ((k, h), (KV_HEADS, HEAD_DIM))
    return shapes


def decay_fn(cfg: ModelConfig) -> lm.DecayFn:
    """h [B, L, D] -> gk [B, L, K, H] (float32, <= 0)."""

    def decay(p: Params, h: jax.Array) -> jax.Array:
        low = jnp.tensordot(h, p["gla_wgk1"].astype(h.dtype), axes=1)
        gk = jnp.tensordot(low, p["gla_wgk2"].astype(h.dtype), axes=1).astype(jnp.float32)
        gk = jax.nn.log_sigmoid(gk + p["gla_bgk"].astype(jnp.float32)) / cfg.gla_gate_normalizer
        return gk if cfg.gla_clamp_min is None else jnp.maximum(gk, cfg.gla_clamp_min)

    return decay


def init_for(name: str, cfg: ModelConfig) -> Initializer:
    """fla's init: projections, gate and conv ~ N(0, init_std), the gate bias 0, the norm 1;
    gla_out depth-scaled like every kind's output projection."""
    if name == "gla_bgk":
        return jax.nn.initializers.zeros
    if name == "gla_norm":
        return jax.nn.initializers.ones
    if name == "gla_out":
        return jax.nn.initializers.normal(residual_std(cfg))
    return default_init(name, cfg)


def validate(cfg: ModelConfig) -> None:
    """GLA's own fields: the gate's rank, normalizer and clamp, the conv kernel."""
    for field in ("gla_gate_rank", "gla_conv_kernel"):
        value = getattr(cfg, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r}")
    if not cfg.gla_gate_normalizer > 0:
        raise ValueError(
            f"ModelConfig.gla_gate_normalizer must be > 0, got {cfg.gla_gate_normalizer!r}"
        )
    if cfg.gla_clamp_min is not None and not -float("inf") < cfg.gla_clamp_min <= 0:
        raise ValueError(
            f"ModelConfig.gla_clamp_min={cfg.gla_clamp_min!r} must be None or a finite log "
            "decay <= 0"
        )


def gate_flops(cfg: ModelConfig) -> int:
    """The low-rank decay gate per token: D -> R -> K*H."""
    return 2 * cfg.gla_gate_rank * (cfg.d_model + cfg.gla_kv_heads * cfg.gla_k_head_dim)


KIND = linear_kind.make("gla", spec, decay_fn, mixer_param_shapes, init_for, validate, gate_flops)
