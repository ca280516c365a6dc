"""The GLA layer kind: fla's GatedLinearAttention (layers/gla.py of flash-linear-attention)
inside the shared block (pre-norms + SwiGLU FFN).

The mixer is layers/linear_mixer.py with a decay per key dim from a low-rank gate on the
un-convolved input: gk = logsigmoid(h W1 [D, R] W2 [R, K, H] + b [K, H]) / normalizer, then
max(gk, clamp_min) when set (fla: gate_low_rank_dim 16, gate_logit_normalizer 16). Per-layer
parameters (the stack adds a leading layers axis, under "gla_layers"): the shared block,
linear_mixer.params(spec) (gla_wq, gla_wk, gla_wv, gla_out; gla_wg with the output gate,
gla_norm with norm_affine, gla_conv_q/k/v with the short conv), gla_wgk1 [D, R], gla_wgk2
[R, K, H], gla_bgk [K, H], and gla_so_out_scale / gla_so_out_offset [N, H] (orthros_h with
scale_offset: the cross query's SO).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthros_jax.axes import EMBED, HEAD_DIM, KV_HEADS
from orthros_jax.config import ModelConfig
from orthros_jax.config import kinds as kind_names
from orthros_jax.config.kinds import GLAOptions
from orthros_jax.layers import linear_kind
from orthros_jax.layers import linear_mixer as lm
from orthros_jax.layers.kind import Export, ParamDecl, Params, matrix, vector


def spec(cfg: ModelConfig) -> lm.Spec:
    """The GLA mixer's spec from cfg.kinds.gla."""
    o = cfg.kinds.gla
    return lm.Spec(
        prefix="gla",
        heads=o.heads,
        kv_heads=o.kv_heads,
        k_dim=o.k_head_dim,
        v_dim=o.v_head_dim,
        feature_map=o.feature_map,
        output_gate=o.output_gate,
        norm_affine=o.norm_affine,
        chunk=o.chunk,
        conv_kernel=o.conv_kernel if o.short_conv else 0,
        norm_eps=cfg.norm_eps,
    )


def mixer_params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """Every per-layer GLA mixer parameter (no layers axis, no SO): linear_mixer.params and the
    decay gate (fla's init: its projections ~ N(0, init_std) and decayed, the bias 0)."""
    o, d, std = cfg.kinds.gla, cfg.d_model, cfg.init_std
    r, k, h = o.gate_rank, o.kv_heads, o.k_head_dim
    decls = lm.params(spec(cfg), cfg)
    decls["gla_wgk1"] = matrix((d, r), (EMBED, None), std)
    decls["gla_wgk2"] = matrix((r, k, h), (None, KV_HEADS, HEAD_DIM), std)
    decls["gla_bgk"] = vector((k, h), (KV_HEADS, HEAD_DIM), jax.nn.initializers.zeros)
    return decls


def decay_fn(cfg: ModelConfig) -> lm.DecayFn:
    """h [B, L, D] -> gk [B, L, K, H] (float32, <= 0)."""
    o = cfg.kinds.gla

    def decay(p: Params, h: jax.Array) -> jax.Array:
        low = jnp.tensordot(h, p["gla_wgk1"].astype(h.dtype), axes=1)
        gk = jnp.tensordot(low, p["gla_wgk2"].astype(h.dtype), axes=1).astype(jnp.float32)
        gk = jax.nn.log_sigmoid(gk + p["gla_bgk"].astype(jnp.float32)) / o.gate_normalizer
        return gk if o.clamp_min is None else jnp.maximum(gk, o.clamp_min)

    return decay


def gate_flops(cfg: ModelConfig) -> int:
    """The low-rank decay gate per token: D -> R -> K*H."""
    o = cfg.kinds.gla
    return 2 * o.gate_rank * (cfg.d_model + o.kv_heads * o.k_head_dim)


# fla's GatedLinearAttention; neither transformers nor modeling_orthros.py has a GLA layer.
EXPORT = Export(fla="gla", note="GLA layers export only as fla's format, a pure gla stack")


class _GLA(linear_kind.LinearKind):
    name = kind_names.GLA
    spec = staticmethod(spec)
    decay = staticmethod(decay_fn)
    mixer_params = staticmethod(mixer_params)
    gate_flops = staticmethod(gate_flops)


KIND = _GLA().kind(GLAOptions, EXPORT)
