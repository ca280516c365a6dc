"""What every layer kind shares: streams, the step context, the kind interface, the FFN half.

A **layer kind** (attention; gated DeltaNet next) owns its parameter shapes with logical axes,
its per-layer state in the cache, and one `step` that every mode drives:
  sequence  the full-sequence forward (PT/SFT): no cache; keys are the sequence itself.
  chunk     one prefill chunk: reads the state the earlier chunks left and writes its own.
  decode    one token per row: writes the token's state and reads the history.
  read      queries only, over a filled cache (prefill's output stream; a single-stream arm's
            last prompt token at the last layer): nothing is written.
The drivers (model.py: training forward; cached_forward.py: chunked prefill and decode;
the benchmark floor as an attention implementation) and the layer loop (stack.py) are
written once over this interface.

Shapes: B batch, T/L tokens, C chunk, S cache slots, D d_model, W window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.axes import EMBED, MLP
from orthros_jax.config import ModelConfig
from orthros_jax.layers import primitives as nnl

Params = dict[str, Any]
SEQUENCE, CHUNK, DECODE, READ = "sequence", "chunk", "decode", "read"


@flax.struct.dataclass
class Stream:
    """One token stream: activations and the original positions/segments of its tokens."""

    x: jax.Array  # [B, L, D]
    positions: jax.Array  # [B, L] int32, original positions (output copies keep their token's)
    segment_ids: (
        jax.Array
    )  # [B, L] int32, document id; the packer's padding is segment 0 (it sees only
    # padding and carries no loss); kernel padding uses KEY/QUERY_PAD_SEGMENT, which match nothing


@flax.struct.dataclass
class StepContext:
    """What a mode tells a layer step. Cached modes address the cache by slot: slot s of a row
    holds the token at position s, so every mask compares slots (see kv_cache.py).

    slots [B, Lb]: where the base tokens' state goes (chunk/decode; S = dropped).
    window_slots: chunk [B, W-1] (the slots right before the chunk), decode/read [B, W] (the
      window ending at the query, itself last); negative or beyond the end = not visible.
    slot_segments [B, S]: 1 for slots a global query may read, padding otherwise.
    valid [B, Lb]: base tokens that exist (not padding, row active).
    reset [B, Lb]: a token that starts a new document (recurrent kinds zero their state before
      it; None: none does). Sequence mode: `document_starts(base)`, computed once per forward.
    out_index [B, T_out]: sequence mode, the array index into the base stream of each output
      copy's token (SFT's output positions); None when the output stream is the base stream
      itself (PT), aligned with it token for token.
    default_positions: sequence mode with positions = arange and one segment.
    Sequence parallelism (inside shard_map; sp_forward.py), where a shard holds S of the cache's
    slots: slot_offset is the global slot id of its first slot; slots are its local slots (S =
    dropped, so other shards' slots are never written); window_slots and positions stay global.
    halo: attend.Keys (head-major) of the slots right before this shard, which a chunk's window
    reads; gathered: attend.Keys of every slot of the layer, which a chunk's global queries read.
    """

    mode: str = flax.struct.field(pytree_node=False)
    impl: str = flax.struct.field(pytree_node=False)
    slots: jax.Array | None = None
    window_slots: jax.Array | None = None
    slot_segments: jax.Array | None = None
    valid: jax.Array | None = None
    reset: jax.Array | None = None
    out_index: jax.Array | None = None
    default_positions: bool = flax.struct.field(pytree_node=False, default=False)
    slot_offset: jax.Array | None = None
    halo: Any = None
    gathered: Any = None


# step(p, cfg, base, out, state, li, ctx, compute_base) -> (base, out, state)
#   p: this layer's parameters; base/out: Stream | None (out: the output stream's copies);
#   state: the kind's whole cache stack (None in sequence mode), written at layer index li;
#   compute_base=False skips the base stream's mixing and FFN (dead in the last layer).
StepFn = Callable[..., tuple[Stream | None, Stream | None, Any]]


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """A kind of layer. `params_key` names its parameter stack in the model's tree
    (stacked on a leading axis over the layers of that kind)."""

    name: str
    params_key: str
    param_shapes: Callable[[ModelConfig], dict[str, tuple[tuple[int, ...], tuple[str, ...]]]]
    init_for: Callable[[str, ModelConfig], Callable[..., jax.Array]]
    init_state: Callable[[ModelConfig, int, int, int, Any], Any]  # (cfg, layers, B, S, dtype)
    state_axes: Callable[[ModelConfig], Any]  # logical axes of the state (pytree like it)
    step: StepFn
    # Can `read` mode run a base token alone (a single-stream arm's last prompt token)?
    reads_last_token: bool = True


def block_param_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """The parts of a layer every kind shares: the two pre-norms and the SwiGLU FFN."""
    d, f = cfg.d_model, cfg.d_ff
    return {
        "attn_norm": ((d,), (EMBED,)),
        "mlp_norm": ((d,), (EMBED,)),
        "w_gate": ((d, f), (EMBED, MLP)),
        "w_up": ((d, f), (EMBED, MLP)),
        "w_down": ((f, d), (MLP, EMBED)),
    }


def norm(p: Params, x: jax.Array, name: str, cfg: ModelConfig) -> jax.Array:
    """A pre-norm of the layer (RMSNorm; scale 1 + w with cfg.norm_zero_centered)."""
    return nnl.rms_norm(x, p[name], cfg.norm_eps, zero_centered=cfg.norm_zero_centered)


def ffn_residual(p: Params, x: jax.Array, mixed: jax.Array, cfg: ModelConfig) -> jax.Array:
    """x + mixed (the token mixer's output after its projection), then the SwiGLU FFN with its
    residual. x, mixed: [B, L, D]."""
    x = x + mixed
    return x + nnl.swiglu(norm(p, x, "mlp_norm", cfg), p["w_gate"], p["w_up"], p["w_down"])


def default_init(name: str, cfg: ModelConfig) -> Callable[..., jax.Array]:
    """Norm scales 1 (0 when zero-centred), SO offsets 0, other weights normal(init_std); the
    residual-branch outputs scaled by 1/sqrt(2 * layers) (GPT-2)."""
    import flax.linen as nn

    if name.endswith("norm"):
        return nn.initializers.zeros if cfg.norm_zero_centered else nn.initializers.ones
    if name.endswith("_scale"):
        return nn.initializers.ones
    if name.endswith("_offset"):
        return nn.initializers.zeros
    std = cfg.init_std
    if name in ("wo", "w_down", "gdn_out"):
        std = std / (2 * cfg.n_layers) ** 0.5
    return nn.initializers.normal(std)


def finish_streams(
    base: Stream | None,
    out: Stream | None,
    y: jax.Array | None,
    y_out: jax.Array | None,
    finish: Callable[[jax.Array, jax.Array], jax.Array],
    merge: bool,
) -> tuple[Stream | None, Stream | None]:
    """The token-wise end of a layer, shared by both streams: finish(x [B, L, D], mixed
    [B, L, ...]) -> new x, applied to each stream whose mixer output is not None. merge=True
    (decode: one token per stream) runs both streams as one [B, 2, D] batch."""
    if merge and y is not None and y_out is not None:
        both = finish(jnp.concatenate([base.x, out.x], 1), jnp.concatenate([y, y_out], 1))
        n = base.x.shape[1]
        return base.replace(x=both[:, :n]), out.replace(x=both[:, n:])
    if y is not None:
        base = base.replace(x=finish(base.x, y))
    if y_out is not None:
        out = out.replace(x=finish(out.x, y_out))
    return base, out


def document_starts(stream: Stream) -> jax.Array:
    """[B, L] True where a packed document starts: the first token, a segment change, or a
    position that does not increase over the previous token's."""
    seg, pos = stream.segment_ids, stream.positions
    starts = (seg[:, 1:] != seg[:, :-1]) | (pos[:, 1:] <= pos[:, :-1])
    return jnp.concatenate([jnp.ones_like(seg[:, :1], bool), starts], axis=1)
