"""What the GLA and retention layer kinds share (the interface of layers/kind.py): the block
around layers/linear_mixer.py's mixer as the recurrent skeleton's Mixer (layers/recurrent.py:
its modes), the stacked cache state and its logical axes, FLOPs. layers/gla.py and
layers/retention.py each subclass `LinearKind` with their spec, decay and parameters. In
Orthros-H (orthros_h) the output copies compute their own cross query (with the SO [N, H] of
`so_names`) and read the base state.

Cache state: linear_mixer.LinearState with every field stacked over the kind's layers:
recurrent [layers, B, N, H, E] float32, conv windows [layers, B, Kc-1, heads, dim].
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from orthros_jax.axes import BATCH, HEAD_DIM, HEADS, KV_HEADS, LAYERS
from orthros_jax.config import ModelConfig
from orthros_jax.config.options import Options
from orthros_jax.layers import linear_mixer as lm
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

Decls = dict[str, ParamDecl]


def per_token_flops(cfg: ModelConfig, spec: lm.Spec, gate: int, ffn: int) -> dict[str, int]:
    """FLOPs one token spends in one layer, by part (as the GDN kind's): what carries the state
    (k / v projections and conv, the decay gate's `gate` FLOPs, the update diag(a) S + k^T v)
    and what reads it (q projection and conv, the output gate, q S, out_proj, the FFN's `ffn`)."""
    d, n, k, h, e, kc = (
        cfg.d_model,
        spec.heads,
        spec.kv_heads,
        spec.k_dim,
        spec.v_dim,
        spec.conv_kernel,
    )
    return {
        "state": 2 * d * k * (h + e) + 2 * kc * k * (h + e) + gate + 3 * n * h * e,
        "q": 2 * d * n * h + 2 * kc * n * h,
        "read": 2 * d * n * e * spec.output_gate + 2 * n * h * e + 2 * n * e * d + ffn,
    }


def so_names(spec: lm.Spec) -> tuple[str, str]:
    return f"{spec.prefix}_so_out_scale", f"{spec.prefix}_so_out_offset"


class LinearKind:
    """A linear-attention layer kind: a subclass gives `name`, its spec, its decay, its mixer's
    parameters and its decay gate's FLOPs; this class is its recurrent.Mixer and its Kind's
    functions (`kind`)."""

    name: str = ""

    def spec(self, cfg: ModelConfig) -> lm.Spec:
        raise NotImplementedError

    def decay(self, cfg: ModelConfig) -> lm.DecayFn:
        raise NotImplementedError

    def mixer_params(self, cfg: ModelConfig) -> Decls:
        raise NotImplementedError

    def gate_flops(self, cfg: ModelConfig) -> int:
        """FLOPs per token of the decay gate (none: a fixed decay)."""
        return 0

    # ------------------------------------------------------------ the Mixer (recurrent.py)

    def cross_so(self, p: Params, cfg: ModelConfig) -> CrossSO | None:
        return cross_so_of(p, cfg, so_names(self.spec(cfg)))

    def has_ffn(self, cfg: ModelConfig) -> bool:
        return True

    def mix(
        self, p: Params, cfg: ModelConfig, a: MixArgs
    ) -> tuple[jax.Array, jax.Array | None, Any]:
        spec = self.spec(cfg)
        if a.state is None:
            a = dataclasses.replace(a, state=lm.init_state(spec, a.h_BLD.shape[0], cfg.jnp_dtype))
        return lm.mix(p, spec, self.decay(cfg), a)

    def decode(
        self, p: Params, cfg: ModelConfig, a: MixArgs
    ) -> tuple[jax.Array, jax.Array | None, Any]:
        return lm.mix(p, self.spec(cfg), self.decay(cfg), a, decode=True)

    def read(self, p: Params, cfg: ModelConfig, a: MixArgs) -> jax.Array:
        return lm.read(
            p,
            a.h_BLD,
            self.spec(cfg),
            state=a.state,
            positions_B1=a.positions_BL,
            cross_so=a.cross_so,
        )

    # ------------------------------------------------------------ the Kind's functions

    def params(self, cfg: ModelConfig) -> Decls:
        decls = block_params(cfg) | self.mixer_params(cfg)
        if cfg.two_streams and cfg.scale_offset:
            spec = self.spec(cfg)
            decls.update(scale_offsets(so_names(spec), (spec.heads, spec.k_dim), (HEADS, HEAD_DIM)))
        return decls

    def init_state(
        self, cfg: ModelConfig, n_layers: int, batch: int, max_len: int, dtype: Any
    ) -> lm.LinearState:
        """linear_mixer.init_state stacked on a leading [layers] axis; max_len is unused."""
        return stacked_state(lambda: lm.init_state(self.spec(cfg), batch, dtype), n_layers)

    def state_axes(self, cfg: ModelConfig) -> lm.LinearState:
        """The recurrent state over batch and heads; conv windows over batch and heads."""
        conv: tuple[Any, ...] = ()
        if self.spec(cfg).conv_kernel:
            conv = tuple(
                (LAYERS, BATCH, None, heads, HEAD_DIM) for heads in (HEADS, KV_HEADS, KV_HEADS)
            )
        return lm.LinearState(recurrent=(LAYERS, BATCH, HEADS, None, None), conv=conv)

    def flops(self, cfg: ModelConfig, work: Work) -> int:
        """The recurrent form's FLOPs (not the chunked form's extra intra-chunk work): the
        state update of every new token, a query + read + FFN per base output and per output
        copy."""
        g = per_token_flops(cfg, self.spec(cfg), self.gate_flops(cfg), work.ffn)
        return work.tokens * g["state"] + (work.base_outputs + work.copies) * (g["q"] + g["read"])

    def kind(self, options: type[Options], export: Export) -> Kind:
        """The registry's entry: parameters under f"{name}_layers", options cfg.kinds.<name>."""
        return Kind(
            name=self.name,
            params_key=f"{self.name}_layers",
            params=self.params,
            init_state=self.init_state,
            state_axes=self.state_axes,
            step=RecurrentStep(self.name, self),
            flops=self.flops,
            recurrent=True,
            options=options,
            export=export,
            reads_last_token=False,
        )
