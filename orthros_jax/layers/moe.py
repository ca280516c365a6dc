"""The mixture-of-experts FFN of a layer (ModelConfig.moe), for both streams at once.

Per-layer parameters (stacked under the model's "moe" key; HF names in convert/qwen3_moe.py):
  router   [D, E]     Linear D -> E without bias, applied in the model dtype
  w_gate   [E, D, I]  each expert's SwiGLU gate / up projections
  w_up     [E, D, I]
  w_down   [E, I, D]
  shared_gate / shared_up [D, Is], shared_down [Is, D], shared_router [D, 1]: the optional
           shared expert (Qwen3.5-MoE), scaled by sigmoid(x shared_router)
The pre-norm (mlp_norm) stays in the layer kind's parameters.

Routing (kernels/moe.py): base tokens route themselves; output copies either take their base
token's k experts with their own gates over those k ("paired", the Orthros rule: both copies
of a token read the same experts' weights) or route themselves ("independent"). Both streams'
tokens go through the experts as one grouped matmul, so in decode the new token and its copy
read each chosen expert once.

Shapes: B batch, L tokens, D d_model, E experts, K top-k, I d_expert, Is the shared width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthros_jax.axes import EMBED, EXPERT, MLP
from orthros_jax.config import ModelConfig
from orthros_jax.kernels import moe as kmoe
from orthros_jax.layers import expert_parallel
from orthros_jax.layers import primitives as nnl
from orthros_jax.layers.kind import ParamDecl, Params, matrix, residual_std

Stats = dict[str, jax.Array]


def params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """One MoE layer's parameters (no leading layers axis): projections normal(init_std), the
    residual-branch outputs (w_down, shared_down) depth-scaled; all weight-decayed."""
    assert cfg.moe is not None
    d, e, i, s = cfg.d_model, cfg.moe.n_experts, cfg.moe.d_expert, cfg.moe.shared_expert
    std, out_std = cfg.init_std, residual_std(cfg)
    decls = {
        "router": matrix((d, e), (EMBED, None), std),
        "w_gate": matrix((e, d, i), (EXPERT, EMBED, MLP), std),
        "w_up": matrix((e, d, i), (EXPERT, EMBED, MLP), std),
        "w_down": matrix((e, i, d), (EXPERT, MLP, EMBED), out_std),
    }
    if s:
        decls.update(
            shared_gate=matrix((d, s), (EMBED, MLP), std),
            shared_up=matrix((d, s), (EMBED, MLP), std),
            shared_down=matrix((s, d), (MLP, EMBED), out_std),
            shared_router=matrix((d, 1), (EMBED, None), std),
        )
    return decls


def active_params(cfg: ModelConfig) -> int:
    """Parameters one token uses in one MoE layer: the router, k experts, the shared expert."""
    assert cfg.moe is not None
    m, d = cfg.moe, cfg.d_model
    shared = 3 * d * m.shared_expert + d if m.shared_expert else 0
    return d * m.n_experts + m.top_k * 3 * d * m.d_expert + shared


def flops_per_token(cfg: ModelConfig) -> int:
    """Matmul FLOPs of one token in one MoE layer (multiply-add = 2): router, k experts and
    the shared expert with its gate (the dense reference implementation spends E experts)."""
    assert cfg.moe is not None
    m, d = cfg.moe, cfg.d_model
    shared = 2 * 3 * d * m.shared_expert + 2 * d if m.shared_expert else 0
    return 2 * d * m.n_experts + m.top_k * 2 * 3 * d * m.d_expert + shared


def _logits(p: Params, h_BLD: jax.Array) -> jax.Array:
    return jnp.einsum("bld,de->ble", h_BLD, p["router"].astype(h_BLD.dtype))


def _route_out(
    cfg: ModelConfig,
    probs_o: jax.Array,
    experts_b: jax.Array | None,
    out_index: jax.Array | None,
    dtype: jnp.dtype,
) -> tuple[jax.Array, jax.Array]:
    """(gates, experts) [B, Lo, K] of the output copies under cfg's routing."""
    assert cfg.moe is not None
    k, normalize = cfg.moe.top_k, cfg.moe.norm_topk_prob
    if cfg.moe_routing == "independent":
        return kmoe.top_k_route(probs_o, k, normalize, dtype)
    if experts_b is None:
        raise ValueError("paired MoE routing needs the base stream's routing at every layer")
    experts_o = experts_b
    if out_index is not None:  # SFT: the copy of base token out_index[b, t]
        experts_o = jnp.take_along_axis(experts_b, out_index[..., None], axis=1)
    return kmoe.paired_gates(probs_o, experts_o, normalize, dtype), experts_o


def _shared(p: Params, h_BLD: jax.Array) -> jax.Array:
    dt = h_BLD.dtype
    y = nnl.swiglu(h_BLD, p["shared_gate"], p["shared_up"], p["shared_down"])
    gate = jax.nn.sigmoid(h_BLD @ p["shared_router"].astype(dt))  # [B, L, 1]
    return gate * y


def moe_ffn(
    p: Params,
    cfg: ModelConfig,
    h_base: jax.Array | None,
    h_out: jax.Array | None,
    out_index: jax.Array | None,
    valid_base: jax.Array | None = None,
    valid_out: jax.Array | None = None,
) -> tuple[jax.Array | None, jax.Array | None, Stats]:
    """The MoE FFN's outputs for the normed inputs of both streams: h_base [B, Lb, D] (None:
    the base stream has no FFN here), h_out [B, Lo, D] (None: no output stream); out_index
    [B, Lo] the copies' base token indices (None: aligned, Lo == Lb). valid_*: [B, L] tokens
    that count in the router statistics (None: all). Returns (y_base, y_out, stats) where stats
    are kernels/moe.router_stats over both streams' tokens."""
    assert cfg.moe is not None
    m = cfg.moe
    dt = (h_base if h_base is not None else h_out).dtype  # type: ignore[union-attr]
    hs, logits, probs, gates, experts, valid = [], [], [], [], [], []
    experts_b = None
    for h, v, is_base in ((h_base, valid_base, True), (h_out, valid_out, False)):
        if h is None:
            continue
        lg = _logits(p, h)
        pr = kmoe.router_probs(lg)
        if is_base:
            g, e = kmoe.top_k_route(pr, m.top_k, m.norm_topk_prob, dt)
            experts_b = e
        else:
            g, e = _route_out(cfg, pr, experts_b, out_index, dt)
        hs.append(h)
        logits.append(lg)
        probs.append(pr)
        gates.append(g)
        experts.append(e)
        valid.append(jnp.ones(h.shape[:2], bool) if v is None else v)
    # Both streams as one [B, Lb + Lo, ...] batch: its rows stay the batch rows (so a mesh's
    # row split holds for both), and one grouped matmul reads each chosen expert once for them.
    cat = lambda xs: jnp.concatenate(xs, axis=1)
    x_BLD, experts_BLK = cat(hs), cat(experts)
    w = (p["w_gate"], p["w_up"], p["w_down"])
    y_BLD = expert_parallel.run_experts(m.impl, x_BLD, *w, cat(gates), experts_BLK)
    if m.shared_expert:
        y_BLD = y_BLD + _shared(p, x_BLD)
    flat = lambda a: a.reshape(-1, *a.shape[2:])
    stats = kmoe.router_stats(
        flat(cat(logits)), flat(cat(probs)), flat(experts_BLK), flat(cat(valid))
    )
    lb = h_base.shape[1] if h_base is not None else 0
    y_base = y_BLD[:, :lb] if h_base is not None else None
    y_out = y_BLD[:, lb:] if h_out is not None else None
    return y_base, y_out, stats
