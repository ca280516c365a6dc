"""The one skeleton of the recurrent layer kinds (gdn, gla, retention, mamba2): a `Mixer` over a
state, and `RecurrentStep`, the kind's step for every mode written once over it.

Modes (layers/kind.py): sequence (the chunked form from an empty state, restarting at packed
documents' starts, ctx.reset), chunk (a prefill chunk: the layer's state in from the cache, out to
it; ctx.valid masks padding), decode (one token per row on the stacked state, in place at the
layer; inactive rows keep their state), read (Orthros-H's output stream after prefill: each copy's
cross query reads the state its token left; nothing is written). A recurrent state needs every
token, so a single-stream arm cannot run its last prompt token alone (reads_last_token=False).

In two-stream arms each output copy computes its own cross query (with the kind's SO) and reads
the base stream's state after its token. SFT's copies (ctx.out_index) sit at some base tokens
only: sequence mode scatters their normed inputs to base alignment (zeros elsewhere), runs the
cross read for every base token and takes the copies back, so a mixer's sequence form only ever
sees aligned streams.

Shapes: B batch, L tokens, T_out output copies, D d_model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.layers.ffn import finish_layer, mix_residual
from orthros_jax.layers.kind import (
    CHUNK,
    DECODE,
    READ,
    SEQUENCE,
    KindState,
    LayerIndex,
    Params,
    StepContext,
    StepOut,
    Stream,
    layer_of,
    norm,
    with_layer,
)

CrossSO = tuple[jax.Array, jax.Array]  # the cross query's scale and offset


@dataclasses.dataclass(frozen=True)
class MixArgs:
    """One mixer call's inputs besides its parameters and config. h_BLD: the layer's normed
    input ([B, 1, D] in decode; in read, the output copies' normed inputs); positions_BL: its
    tokens' positions; state: one layer's state (None: the empty state) or, in decode, the
    stack of every layer's, entry `layer` written in place; valid_BL: False at a prefill
    chunk's padding, or decode's inactive rows ([B, 1]); reset_BL: True at packed documents'
    first tokens; cross_h_BLD: the output copies' normed inputs aligned with h (None: no output
    stream); cross_so: the cross query's SO (Mixer.cross_so)."""

    h_BLD: jax.Array
    positions_BL: jax.Array
    state: Any = None
    layer: Any = None
    valid_BL: jax.Array | None = None
    reset_BL: jax.Array | None = None
    cross_h_BLD: jax.Array | None = None
    cross_so: CrossSO | None = None


class Mixer(Protocol):
    """A recurrent kind's token mixer over MixArgs. mix and decode return (y [B, L, D],
    cross_y [B, L, D] or None, the new state); read returns cross_y [B, 1, D]."""

    def cross_so(self, p: Params, cfg: ModelConfig) -> CrossSO | None:
        """The cross query's SO of a two-stream arm with scale_offset, else None."""
        ...

    def has_ffn(self, cfg: ModelConfig) -> bool:
        """Does the block end in the shared SwiGLU FFN (else: the residual alone)?"""
        ...

    def mix(
        self, p: Params, cfg: ModelConfig, a: MixArgs
    ) -> tuple[jax.Array, jax.Array | None, Any]:
        """The chunked form over L tokens from a.state (one layer's; None: the empty state)."""
        ...

    def decode(
        self, p: Params, cfg: ModelConfig, a: MixArgs
    ) -> tuple[jax.Array, jax.Array | None, Any]:
        """One token per row on the stacked state, written in place at a.layer."""
        ...

    def read(self, p: Params, cfg: ModelConfig, a: MixArgs) -> jax.Array:
        """The copies' cross read of one layer's state (nothing is written)."""
        ...


def sequence(
    m: Mixer, p: Params, cfg: ModelConfig, base: Stream, out: Stream | None, ctx: StepContext
) -> tuple[jax.Array, jax.Array | None]:
    """Sequence mode: (y [B, L, D], cross_y [B, T_out, D] or None), SFT copies scattered to
    their base tokens and taken back (see the module docstring)."""
    h = norm(p, base.x, "attn_norm", cfg)
    a = MixArgs(h, base.positions, reset_BL=ctx.reset)
    if out is None:
        y, _, _ = m.mix(p, cfg, a)
        return y, None
    h_out = norm(p, out.x, "attn_norm", cfg).astype(h.dtype)
    idx = ctx.out_index
    if idx is not None:
        rows = jnp.arange(idx.shape[0], dtype=jnp.int32)[:, None]
        h_out = jnp.zeros_like(h).at[rows, idx].set(h_out)
    a = dataclasses.replace(a, cross_h_BLD=h_out, cross_so=m.cross_so(p, cfg))
    y, cross_y, _ = m.mix(p, cfg, a)
    if idx is not None:
        assert cross_y is not None
        cross_y = jnp.take_along_axis(cross_y, idx[:, :, None], axis=1)
    return y, cross_y


@dataclasses.dataclass(frozen=True)
class RecurrentStep:
    """A recurrent kind's StepFn (layers/kind.py): `name` for messages, `mixer` its math."""

    name: str
    mixer: Mixer

    def __call__(
        self,
        p: Params,
        cfg: ModelConfig,
        base: Stream | None,
        out: Stream | None,
        state: KindState,
        li: LayerIndex,
        ctx: StepContext,
        compute_base: bool = True,
    ) -> StepOut:
        """One layer for both streams in ctx.mode. Returns (base, out, state)."""
        m, so = self.mixer, self.mixer.cross_so(p, cfg)
        y: jax.Array | None = None
        cross_y: jax.Array | None = None
        if ctx.mode == SEQUENCE:
            assert base is not None
            y, cross_y = sequence(m, p, cfg, base, out, ctx)
        elif ctx.mode == READ:
            if base is not None or out is None:
                raise ValueError(f"a {self.name} layer cannot read a base token alone")
            h_out = norm(p, out.x, "attn_norm", cfg)
            a = MixArgs(h_out, out.positions, layer_of(state, li), cross_so=so)
            cross_y = m.read(p, cfg, a)
        elif ctx.mode == CHUNK:
            if out is not None or base is None:
                raise ValueError("prefill chunks run the base stream only")
            h = norm(p, base.x, "attn_norm", cfg)
            a = MixArgs(h, base.positions, layer_of(state, li), None, ctx.valid, ctx.reset)
            y, _, new = m.mix(p, cfg, a)
            state = with_layer(state, li, new)
        elif ctx.mode == DECODE:
            assert base is not None and ctx.valid is not None
            h = norm(p, base.x, "attn_norm", cfg)
            cross_h = None if out is None else norm(p, out.x, "attn_norm", cfg)
            a = MixArgs(h, base.positions, state, li, ctx.valid, None, cross_h, so)
            y, cross_y, state = m.decode(p, cfg, a)
        else:
            raise ValueError(f"unknown mode {ctx.mode!r}")
        if not compute_base:
            y = None
        # The FFN seam (dense or MoE; layers/ffn.py), token-wise and shared by both streams.
        base, out = finish_layer(p, cfg, ctx, base, out, y, cross_y, mix_residual, m.has_ffn(cfg))
        return base, out, state


def stacked_state(one: Callable[[], Any], n_layers: int) -> Any:
    """The zero state of one layer (one(): its pytree) stacked on a leading [layers] axis."""
    shapes = jax.eval_shape(one)
    return jax.tree.map(lambda a: jnp.zeros((n_layers, *a.shape), a.dtype), shapes)


def cross_so_of(p: Params, cfg: ModelConfig, names: tuple[str, str]) -> CrossSO | None:
    """The cross query's SO stored under `names` (two-stream arms with scale_offset)."""
    if cfg.two_streams and cfg.scale_offset:
        return p[names[0]], p[names[1]]
    return None
