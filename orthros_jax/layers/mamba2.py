"""The Mamba-2 layer kind ("mamba2"): the SSD mixer of layers/mamba2_mixer.py (transformers'
Mamba2Mixer) in our block, its options cfg.kinds.mamba2 (mamba2_mixer.Mamba2Options).

Block: with options.ffn (the default) the shared one (pre-norms + SwiGLU FFN, as every kind,
so a hybrid cycle's layers are alike); without it x + mixer(rmsnorm(x)), a transformers
Mamba2 block (which has no MLP; the import sets ffn=False and a pure stack is then exactly
Mamba2ForCausalLM), with attn_norm its only block parameter.

Orthros-H: each output copy at base token t reads the base state after t with its own C
(silu(h' Wc), no conv, then its SO [G, Ns]), its own D-skip input x' and gate z' (the rule of
the GDN cross query; mamba2_mixer's docstring says why x' is the copy's own).

Modes (kind.py): sequence (the chunked kernel; state and conv windows restart at packed-document
starts), chunk (state in from the cache and out to it), decode (the stacked state in place),
read (orthros_h's output stream after prefill). reads_last_token=False: the state needs every
token.

Per-layer parameters (under "mamba2_layers", stacked over the kind's layers): the block's,
mamba2_mixer.mixer_params, and mamba2_so_out_scale / mamba2_so_out_offset [G, Ns] (orthros_h
with scale_offset). Cache state: mamba2_mixer.Mamba2State with every field stacked.

Export: hf = transformers' Mamba2ForCausalLM, for a pure stack without FFN (convert/mamba2_hf.py:
a whole model class, not a layer type, so convert/export.py's WHOLE_MODELS maps the name); no
fla or trust_remote_code form.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from orthros_jax.axes import BATCH, HEAD_DIM, HEADS, KV_HEADS, LAYERS
from orthros_jax.config import ModelConfig
from orthros_jax.config import kinds as kind_names
from orthros_jax.layers import mamba2_mixer as mm
from orthros_jax.layers.kind import (
    Export,
    Kind,
    ParamDecl,
    Params,
    Work,
    block_params,
    residual_std,
    scale_offsets,
)
from orthros_jax.layers.recurrent import (
    CrossSO,
    MixArgs,
    RecurrentStep,
    cross_so_of,
    stacked_state,
)

SO_NAMES = ("mamba2_so_out_scale", "mamba2_so_out_offset")


def options(cfg: ModelConfig) -> mm.Mamba2Options:
    """The kind's options section of cfg."""
    o = cfg.kinds.mamba2
    assert isinstance(o, mm.Mamba2Options)
    return o


def params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """Every per-layer parameter (without the leading layers axis): the block's (all of it with
    the FFN, else its pre-norm), the mixer's and the cross query's SO (orthros_h with
    scale_offset)."""
    o = options(cfg)
    block = block_params(cfg)
    decls = dict(block) if o.ffn else {"attn_norm": block["attn_norm"]}
    decls.update(mm.mixer_params(o, cfg.d_model, cfg.init_std, residual_std(cfg)))
    if cfg.two_streams and cfg.scale_offset:
        decls.update(scale_offsets(SO_NAMES, *mm.so_shape(o)))
    return decls


class _Mixer:
    """mamba2_mixer as the recurrent skeleton's Mixer (layers/recurrent.py); without the FFN
    (kinds.mamba2.ffn=False, the HF block) a layer is x + mixer(norm(x))."""

    def cross_so(self, p: Params, cfg: ModelConfig) -> CrossSO | None:
        return cross_so_of(p, cfg, SO_NAMES)

    def has_ffn(self, cfg: ModelConfig) -> bool:
        return options(cfg).ffn

    def mix(
        self, p: Params, cfg: ModelConfig, a: MixArgs
    ) -> tuple[jax.Array, jax.Array | None, Any]:
        o = options(cfg)
        if a.state is None:
            a = dataclasses.replace(a, state=mm.init_state(o, a.h_BLD.shape[0], cfg.jnp_dtype))
        return mm.mix(p, o, cfg.norm_eps, a)

    def decode(
        self, p: Params, cfg: ModelConfig, a: MixArgs
    ) -> tuple[jax.Array, jax.Array | None, Any]:
        return mm.mix(p, options(cfg), cfg.norm_eps, a, decode=True)

    def read(self, p: Params, cfg: ModelConfig, a: MixArgs) -> jax.Array:
        return mm.read(p, a.h_BLD, options(cfg), cfg.norm_eps, state=a.state, cross_so=a.cross_so)


def init_state(
    cfg: ModelConfig, n_layers: int, batch: int, max_len: int, dtype: Any
) -> mm.Mamba2State:
    """mamba2_mixer.init_state stacked on a leading [layers] axis; max_len is unused."""
    return stacked_state(lambda: mm.init_state(options(cfg), batch, dtype), n_layers)


def state_axes(cfg: ModelConfig) -> mm.Mamba2State:
    """Conv windows over batch and heads / groups; the SSM state over batch and heads."""
    grouped = (LAYERS, BATCH, None, KV_HEADS, HEAD_DIM)
    return mm.Mamba2State(
        conv_x=(LAYERS, BATCH, None, HEADS, HEAD_DIM),
        conv_b=grouped,
        conv_c=grouped,
        recurrent=(LAYERS, BATCH, HEADS, None, None),
    )


def flops(cfg: ModelConfig, work: Work) -> int:
    """The recurrent form's FLOPs (not the chunked form's intra-chunk work): per new token the
    x / B / dt projections, their conv and the state update; per base output and output copy
    the C projection and conv, z, the read C S + D x, out_proj and the FFN (a copy also
    projects its own x')."""
    o, d = options(cfg), cfg.d_model
    inner, gs, kc = o.heads * o.head_dim, o.groups * o.state, o.conv_kernel
    state = 2 * d * (inner + gs + o.heads) + 2 * kc * (inner + gs) + 3 * inner * o.state
    read = 2 * d * gs + 2 * kc * gs + 2 * d * inner + 2 * inner * o.state + 2 * inner * d
    read += work.ffn if o.ffn else 0
    outputs = work.base_outputs + work.copies
    return work.tokens * state + outputs * read + work.copies * 2 * d * inner


def check_exportable(cfg: ModelConfig) -> mm.Mamba2Options:
    """cfg's options if it is a transformers Mamba2 (a pure mamba2 stack without FFN), else a
    ValueError saying what differs."""
    o = options(cfg)
    if set(cfg.layer_types) != {"mamba2"} or cfg.two_streams or o.ffn:
        raise ValueError(
            "a transformers Mamba2ForCausalLM export needs a pure mamba2 stack without FFN "
            "(layer_types ('mamba2',), kinds.mamba2.ffn=False, one stream); got layer_types "
            f"{cfg.layer_types}, architecture {cfg.architecture!r}, ffn={o.ffn}"
        )
    if cfg.norm_zero_centered:
        raise ValueError("a Mamba2 export needs norm_zero_centered=False (plain RMSNorm scales)")
    return o


KIND = Kind(
    name=kind_names.MAMBA2,
    params_key="mamba2_layers",
    params=params,
    init_state=init_state,
    state_axes=state_axes,
    step=RecurrentStep("mamba2", _Mixer()),
    flops=flops,
    recurrent=True,
    options=mm.Mamba2Options,
    # transformers' Mamba2ForCausalLM, a whole model class (convert/mamba2_hf.py), not a
    # layer type; it takes only a pure stack without FFN (check_exportable says so).
    export=Export(
        hf="Mamba2ForCausalLM",
        note="Mamba-2 layers export only as transformers' Mamba2ForCausalLM, a pure mamba2 "
        "stack without FFN",
    ),
    reads_last_token=False,
)
