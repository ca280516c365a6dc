"""The gated DeltaNet layer kind: one step for every mode (see kind.py).

A GDN layer is the shared block (pre-norms + SwiGLU FFN, kind.block_params) around
the Qwen3.5 GDN mixer of gdn_mixer.py. Single-stream arms (gdn, hybrid) run it on the one stream. In
Orthros-H (orthros_h) the base stream runs the mixer and carries the state; each output copy
computes its own cross query (SiLU, no conv, its own SO [Hk, dk] before the L2 norm, from its
own normed hidden state) and reads the base state after its token, o' = q' S_t; the gate z, the
gated norm, out_proj and the FFN are shared. The base query has no SO, so a Qwen3.5 checkpoint
is the Orthros-H model with identity cross SO.

Per-layer parameters (the stack adds a leading layers axis, under "gdn_layers"): the shared
block, gdn_mixer.gdn_params, and gdn_so_out_scale / gdn_so_out_offset [Hk, dk] (orthros_h with
scale_offset). The cache state is gdn_mixer.GDNState with every field stacked over the GDN layers
(KVCache.states['gdn']): conv windows [layers, B, Kc-1, heads, dim], recurrent
[layers, B, Hv, dk, dv].


Modes: sequence (chunked rule; the state restarts where segment_ids change or positions do not
increase, i.e. at packed-document starts; padding, segment 0 and last, is its own document so
it never reaches a real token), chunk (state in from the cache, out to it; ctx.valid masks
padding), decode (recurrent step; inactive rows keep their state), read (orthros_h's output
stream after prefill: the cross query reads the final state). A single-stream arm cannot run
its last prompt token alone through a GDN layer (the state needs every token), so the kind sets
reads_last_token=False and prefill runs such a last layer in full.
"""

from __future__ import annotations

from typing import Any

import jax

from orthros_jax.axes import BATCH, GDN_K_HEADS, GDN_V_HEADS, HEAD_DIM, LAYERS
from orthros_jax.config import ModelConfig
from orthros_jax.config import kinds as kind_names
from orthros_jax.config.kinds import GDNOptions
from orthros_jax.layers import gdn_mixer
from orthros_jax.layers.kind import (
    Export,
    Kind,
    ParamDecl,
    Params,
    Work,
    block_params,
    scale_offsets,
)
from orthros_jax.layers.recurrent import (
    CrossSO,
    MixArgs,
    RecurrentStep,
    cross_so_of,
    stacked_state,
)

SO_NAMES = ("gdn_so_out_scale", "gdn_so_out_offset")


def params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """Every per-layer parameter (without the leading layers axis): the shared block, the
    mixer's (gdn_mixer.gdn_params) and the cross query's SO (orthros_h with scale_offset)."""
    decls: dict[str, ParamDecl] = block_params(cfg) | gdn_mixer.gdn_params(cfg)
    if cfg.two_streams and cfg.scale_offset:
        o = cfg.kinds.gdn
        decls.update(
            scale_offsets(SO_NAMES, (o.num_k_heads, o.k_head_dim), (GDN_K_HEADS, HEAD_DIM))
        )
    return decls


class _Mixer:
    """gdn_mixer as the recurrent skeleton's Mixer (layers/recurrent.py)."""

    def cross_so(self, p: Params, cfg: ModelConfig) -> CrossSO | None:
        return cross_so_of(p, cfg, SO_NAMES)

    def has_ffn(self, cfg: ModelConfig) -> bool:
        return True

    def mix(
        self, p: Params, cfg: ModelConfig, a: MixArgs
    ) -> tuple[jax.Array, jax.Array | None, Any]:
        return gdn_mixer.gdn_mix(
            p,
            a.h_BLD,
            cfg,
            state=a.state,
            valid_BL=a.valid_BL,
            reset_BL=a.reset_BL,
            cross_h_BLD=a.cross_h_BLD,
            cross_so=a.cross_so,
        )

    def decode(
        self, p: Params, cfg: ModelConfig, a: MixArgs
    ) -> tuple[jax.Array, jax.Array | None, Any]:
        assert a.valid_BL is not None
        return gdn_mixer.gdn_decode(
            p,
            a.h_BLD,
            cfg,
            state=a.state,
            layer=a.layer,
            active_B=a.valid_BL[:, 0],
            cross_h_B1D=a.cross_h_BLD,
            cross_so=a.cross_so,
        )

    def read(self, p: Params, cfg: ModelConfig, a: MixArgs) -> jax.Array:
        return gdn_mixer.gdn_read(p, a.h_BLD, cfg, state=a.state, cross_so=a.cross_so)


def init_state(
    cfg: ModelConfig, n_layers: int, batch: int, max_len: int, dtype: Any
) -> gdn_mixer.GDNState:
    """gdn_mixer.init_gdn_state (conv windows in dtype, recurrent float32) with every field stacked
    on a leading [layers] axis; max_len is unused (the state does not grow with the sequence)."""
    return stacked_state(lambda: gdn_mixer.init_gdn_state(cfg, batch, dtype), n_layers)


def state_axes(cfg: ModelConfig) -> gdn_mixer.GDNState:
    """Logical axes of the stacked state: conv windows over batch and heads, the recurrent
    state over batch and value heads."""
    k_conv = (LAYERS, BATCH, None, GDN_K_HEADS, HEAD_DIM)
    return gdn_mixer.GDNState(
        conv_q=k_conv,
        conv_k=k_conv,
        conv_v=(LAYERS, BATCH, None, GDN_V_HEADS, HEAD_DIM),
        recurrent=(LAYERS, BATCH, GDN_V_HEADS, None, None),
    )


def per_token_flops(cfg: ModelConfig, ffn: int) -> dict[str, int]:
    """FLOPs one token spends in one GDN layer, by part: what carries the state (k/v/beta/decay
    projections, their conv, the rank-1 update with its k^T S read) and what reads it (q
    projection and conv, the gate z, q^T S, out_proj, the FFN's `ffn` FLOPs)."""
    d, kc = cfg.d_model, cfg.kinds.gdn.conv_kernel
    hk, hv, dk, dv = gdn_mixer.gdn_dims(cfg)
    return {
        "state": 2 * d * (hk * dk + hv * dv + 2 * hv)
        + 2 * kc * (hk * dk + hv * dv)
        + 4 * hv * dk * dv,
        "q": 2 * d * hk * dk + 2 * kc * hk * dk,
        "read": 2 * d * hv * dv + 2 * hv * dk * dv + 2 * hv * dv * d + ffn,
    }


def flops(cfg: ModelConfig, work: Work) -> int:
    """The recurrent form's FLOPs (not the chunked form's extra intra-chunk work): the state
    update of every new token, a query + read + FFN per base output and per output copy (an
    Orthros-H copy reads the state with its own query, gate, out_proj and FFN)."""
    g = per_token_flops(cfg, work.ffn)
    return work.tokens * g["state"] + (work.base_outputs + work.copies) * (g["q"] + g["read"])


KIND = Kind(
    name=kind_names.GDN,
    params_key="gdn_layers",
    params=params,
    init_state=init_state,
    state_axes=state_axes,
    step=RecurrentStep("gdn", _Mixer()),
    flops=flops,
    recurrent=True,
    options=GDNOptions,
    # Qwen3.5's linear attention (transformers; modeling_orthros.py's gdn_orthros.py with the
    # cross query), fla's GatedDeltaNet.
    export=Export(hf="linear_attention", remote="linear_attention", fla="gated_deltanet"),
    reads_last_token=False,
)
