"""The FFN half of a layer, a seam like the layer kinds: dense SwiGLU or a mixture of experts.

Without ModelConfig.moe every layer's dense SwiGLU lives in its kind's parameters (w_gate,
w_up, w_down: the historic layout). With it, each position of the layer cycle has an FFN
(cfg.ffn_types, from moe.ffn_cycle: HF's decoder_sparse_step / mlp_only_layers) whose
parameters are stacked under the FFN's own key, over the layers that have it: FFNS["moe"]
(layers/moe.py) under "moe", FFNS["dense"] under "ffn"; the layer loop (stack.py) hands a
layer its FFN's entry as p["moe"] or p["ffn"]. The pre-norm mlp_norm stays in the kind's.

`finish_layer` is the token-wise end every kind's step calls: the mixer's residual, then the
FFN with its residual for both streams (the MoE routes them together: layers/moe.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.config.kinds import DENSE_FFN, MOE_FFN
from orthros_jax.layers import moe
from orthros_jax.layers import primitives as nnl
from orthros_jax.layers.kind import (
    DECODE,
    SEQUENCE,
    ParamDecl,
    Params,
    StepContext,
    Stream,
    dense_ffn_params,
    norm,
)


def _dense_flops(cfg: ModelConfig) -> int:
    return 2 * 3 * cfg.d_model * cfg.d_ff


def _dense_active(cfg: ModelConfig) -> int:
    return 3 * cfg.d_model * cfg.d_ff


@dataclasses.dataclass(frozen=True)
class FFN:
    """An FFN choice, declared like a layer kind: its parameter stack's key, its per-layer
    parameters (kind.ParamDecl: shape, logical axes, decay, init), the parameters one token
    uses (active), its matmul FLOPs per token and whether it is a routed mixture of experts
    (configured by ModelConfig.moe)."""

    name: str
    params_key: str
    params: Callable[[ModelConfig], dict[str, ParamDecl]]
    active_params: Callable[[ModelConfig], int]
    flops_per_token: Callable[[ModelConfig], int]
    routed: bool = False

    def num_params(self, cfg: ModelConfig) -> int:
        """Parameters of one layer's FFN of this choice."""
        return sum(math.prod(d.shape) for d in self.params(cfg).values())


FFNS: dict[str, FFN] = {
    DENSE_FFN: FFN(DENSE_FFN, "ffn", dense_ffn_params, _dense_active, _dense_flops),
    MOE_FFN: FFN(MOE_FFN, MOE_FFN, moe.params, moe.active_params, moe.flops_per_token, routed=True),
}


def ffns_of(cfg: ModelConfig) -> list[FFN]:
    """The FFN stacks a config has, in cycle order (none without moe)."""
    return [FFNS[name] for name in dict.fromkeys(cfg.ffn_types)]


def layer_flops(cfg: ModelConfig) -> list[int]:
    """Matmul FLOPs one token spends in each layer's FFN, in layer order (cfg.layer_slots):
    the dense SwiGLU without moe, else each layer's FFN choice's declared flops_per_token
    (layers/flops.py hands them to the kinds' counts as Work.ffn)."""
    per = len(cfg.layer_types)
    choices = cfg.ffn_types or (DENSE_FFN,) * per
    return [FFNS[choices[i % per]].flops_per_token(cfg) for i in range(cfg.n_layers)]


def num_params(cfg: ModelConfig, active: bool = False) -> int:
    """Parameters of every FFN stack (active: those one token uses)."""
    per = (lambda f: f.active_params(cfg)) if active else (lambda f: f.num_params(cfg))
    return sum(per(f) * cfg.ffn_layers(f.name) for f in ffns_of(cfg))


def empty_stats(cfg: ModelConfig) -> dict[str, jax.Array] | None:
    """Zero router statistics to sum a forward's MoE layers into (None without moe)."""
    if cfg.moe is None:
        return None
    k, e = cfg.moe.top_k, cfg.moe.n_experts
    zero = jnp.zeros((), jnp.float32)
    return {"count": jnp.zeros((k, e)), "prob": jnp.zeros((e,)), "z": zero, "tokens": zero}


def _dense(p: Params, h: jax.Array) -> jax.Array:
    w = p["ffn"] if "ffn" in p else p
    return nnl.swiglu(h, w["w_gate"], w["w_up"], w["w_down"])


def finish_layer(
    p: Params,
    cfg: ModelConfig,
    ctx: StepContext,
    base: Stream | None,
    out: Stream | None,
    y: jax.Array | None,
    y_out: jax.Array | None,
    mix: Callable[[jax.Array, jax.Array], jax.Array],
    has_ffn: bool = True,
) -> tuple[Stream | None, Stream | None]:
    """The token-wise end of a layer for each stream whose mixer output (y [B, Lb, ...], y_out
    [B, Lo, ...]) is not None: mix(x, mixed) is the mixer's residual (x + its projection),
    then the FFN and its residual (has_ffn=False: a block without FFN, e.g. HF's Mamba2 block).
    Dense: per stream (decode: both as one [B, 2, D] batch). MoE: both streams together (paired
    routing reads the base tokens' experts; needs y unless routing is independent); in
    sequence mode the router statistics are added to base.moe_stats."""
    hb = None if y is None else mix(base.x, y)  # type: ignore[union-attr]
    ho = None if y_out is None else mix(out.x, y_out)  # type: ignore[union-attr]
    if not has_ffn:
        base = base if hb is None else base.replace(x=hb)  # type: ignore[union-attr]
        return base, out if ho is None else out.replace(x=ho)  # type: ignore[union-attr]
    if hb is None and ho is None:  # no stream runs this layer's FFN (a dead last layer)
        return base, out
    if MOE_FFN in p:
        nb = None if hb is None else norm(p, hb, "mlp_norm", cfg)
        no = None if ho is None else norm(p, ho, "mlp_norm", cfg)
        valid_b = valid_o = None
        if ctx.mode == SEQUENCE:  # the packer's padding (segment 0) is not routed for the loss
            valid_b = base.segment_ids != 0 if base is not None else None
            valid_o = out.segment_ids != 0 if out is not None else None
        fb, fo, stats = moe.moe_ffn(p["moe"], cfg, nb, no, ctx.out_index, valid_b, valid_o)
        if base is not None and base.moe_stats is not None:
            base = base.replace(moe_stats=jax.tree.map(jnp.add, base.moe_stats, stats))
        if hb is not None:
            base = base.replace(x=hb + fb)  # type: ignore[union-attr, operator]
        if ho is not None:
            out = out.replace(x=ho + fo)  # type: ignore[union-attr, operator]
        return base, out
    ffn = lambda h: h + _dense(p, norm(p, h, "mlp_norm", cfg))
    if ctx.mode == DECODE and hb is not None and ho is not None:
        n = hb.shape[1]
        both = ffn(jnp.concatenate([hb, ho], 1))
        return base.replace(x=both[:, :n]), out.replace(x=both[:, n:])  # type: ignore[union-attr]
    if hb is not None:
        base = base.replace(x=ffn(hb))  # type: ignore[union-attr]
    if ho is not None:
        out = out.replace(x=ffn(ho))  # type: ignore[union-attr]
    return base, out


def mix_residual(x: jax.Array, mixed: jax.Array) -> jax.Array:
    """x + mixed in x's dtype (a mixer's output after its projection, [B, L, D])."""
    return x + mixed.astype(x.dtype)
