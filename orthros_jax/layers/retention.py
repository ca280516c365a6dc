"""The retention layer kind (arm "retnet"): fla's MultiScaleRetention (layers/
multiscale_retention.py of flash-linear-attention) inside the shared block.

The mixer is layers/linear_mixer.py without a conv, with rotary on q and k (rotate-half over
the whole key head dim, base 10000, at each token's position) and a fixed decay per head,
gamma_n = 1 - 2^(-5-n). Per-layer parameters (under "retention_layers"): the shared block,
linear_mixer.params(spec) (retention_wq, retention_wk, retention_wv, retention_out; retention_wg
with the output gate, retention_norm with norm_affine), and retention_so_out_scale /
retention_so_out_offset [N, H] (orthros_h with scale_offset).
"""

from __future__ import annotations

import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.config import kinds as kind_names
from orthros_jax.config.kinds import RetentionOptions
from orthros_jax.layers import linear_kind
from orthros_jax.layers import linear_mixer as lm
from orthros_jax.layers.kind import Export, ParamDecl


def spec(cfg: ModelConfig) -> lm.Spec:
    """The retention mixer's spec from cfg.kinds.retention."""
    o = cfg.kinds.retention
    return lm.Spec(
        prefix="retention",
        heads=o.heads,
        kv_heads=o.kv_heads,
        k_dim=o.k_head_dim,
        v_dim=o.v_head_dim,
        feature_map=o.feature_map,
        output_gate=o.output_gate,
        norm_affine=o.norm_affine,
        chunk=o.chunk,
        rotary=True,
        norm_eps=cfg.norm_eps,
    )


def mixer_params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """Every per-layer retention mixer parameter (no layers axis, no SO): linear_mixer.params."""
    return lm.params(spec(cfg), cfg)


def decay_fn(cfg: ModelConfig) -> lm.DecayFn:
    """The fixed log decays [N]: log(1 - 2^(-5-n))."""
    log_gamma = jnp.log1p(
        -(2.0 ** (-5.0 - jnp.arange(cfg.kinds.retention.heads, dtype=jnp.float32)))
    )
    return lambda p, h: log_gamma


# fla's MultiScaleRetention; neither transformers nor modeling_orthros.py has a retention layer.
EXPORT = Export(fla="retnet", note="retention layers export only as fla's format, a pure stack")


class _Retention(linear_kind.LinearKind):
    name = kind_names.RETENTION  # a fixed decay: no gate FLOPs (LinearKind.gate_flops)
    spec = staticmethod(spec)
    decay = staticmethod(decay_fn)
    mixer_params = staticmethod(mixer_params)


KIND = _Retention().kind(RetentionOptions, EXPORT)
