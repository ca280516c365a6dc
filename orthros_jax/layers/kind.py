"""What every layer kind shares: streams, the step context, the kind interface, the pre-norms
(the FFN half is layers/ffn.py).

A **layer kind** (attention, gated DeltaNet, GLA, retention, Mamba-2: layers/registry.py's
KINDS) declares each parameter (shape, logical axes, weight decay, init: `ParamDecl`), whether
it is recurrent, its options (a section of ModelConfig.kinds, options.Options), its FLOPs, its
export names (`Export`), its per-layer state in the cache, and one `step` that every mode
drives:
  sequence  the full-sequence forward (PT/SFT): no cache; keys are the sequence itself.
  chunk     one prefill chunk: reads the state the earlier chunks left and writes its own.
  decode    one token per row: writes the token's state and reads the history.
  read      queries only, over a filled cache (prefill's output stream; a single-stream arm's
            last prompt token at the last layer): nothing is written.
The drivers (model.py: training forward; inference/drivers.py: chunked prefill and decode;
the benchmark floor as an attention implementation) and the layer loop (stack.py) are
written once over this interface.

Shapes: B batch, T/L tokens, C chunk, S cache slots, D d_model, W window.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax.axes import EMBED, MLP
from orthros_jax.config import ModelConfig
from orthros_jax.config.options import Options
from orthros_jax.layers import primitives as nnl
from orthros_jax.layers.attend import AttentionImpl, Keys

Params = dict[str, Any]
# A kind's cache state: the pytree of arrays its init_state returns, every leaf stacked over the
# kind's layers [layers, B, ...] (attention: K/V [layers, B, K, S, H]; a recurrent kind: its
# fixed-size state). Its structure is the kind's own, hence a pytree, not a class.
KindState = Any
# The logical axes of a KindState: the same pytree with a tuple of axis names per leaf.
StateAxes = Any
# The index of a layer within its kind's stack: traced inside the layer loop's scan.
LayerIndex = jax.Array | int
KV = tuple[jax.Array, jax.Array]


class Stream(flax.struct.PyTreeNode):
    """One token stream: activations and the original positions/segments of its tokens."""

    x: jax.Array  # [B, L, D]
    positions: jax.Array  # [B, L] int32, original positions (output copies keep their token's)
    segment_ids: (
        jax.Array
    )  # [B, L] int32, document id; the packer's padding is segment 0 (it sees only
    # padding and carries no loss); kernel padding uses KEY/QUERY_PAD_SEGMENT, which match nothing
    # The training forward's base stream with MoE layers: the router statistics summed over
    # the layers so far (kernels/moe.router_stats; layers/ffn.finish_layer adds to it).
    moe_stats: dict[str, jax.Array] | None = None


class Mode(enum.Enum):
    """What a layer step is asked to do (see the module docstring)."""

    SEQUENCE = "sequence"
    CHUNK = "chunk"
    DECODE = "decode"
    READ = "read"


SEQUENCE, CHUNK, DECODE, READ = Mode.SEQUENCE, Mode.CHUNK, Mode.DECODE, Mode.READ
CACHED_MODES = (CHUNK, DECODE, READ)


class CacheView(Protocol):
    """Where an attention-like step finds its cache entries in chunk / decode / read mode
    (layers/cache_view.py: the single-device `SlotView`; parallel/sequence.py: a sequence
    shard's view). Shapes: B batch, L base tokens, K kv heads, H head dim."""

    def write(self, stack: jax.Array, li: LayerIndex, x_BLKH: jax.Array) -> jax.Array:
        """The K or V stack with this mode's base tokens [B, L, K, H] written at layer li."""
        ...

    def keys(
        self,
        ck: jax.Array,
        cv: jax.Array,
        li: LayerIndex,
        mode: Mode,
        base: Stream | None,
        kv: KV | None,
    ) -> tuple[Keys, Keys]:
        """(window keys, global keys) of layer li after this mode's writes. kv: the chunk's
        own (k, v) [B, L, K, H] (chunk mode)."""
        ...


class StepContext(flax.struct.PyTreeNode):
    """What a mode tells every layer step.

    mode: the Mode. impl: how attention-like kinds attend (an `attend.AttentionImpl` or the
      name of a registered one; static; None: the config's attention_impl).
    view: cached modes, where a kind finds its cache entries: slots to write, the window and
      the global keys to read (a `CacheView`; the drivers build a `SlotView`, sequence
      parallelism its shard view). None in sequence mode.
    valid [B, Lb]: base tokens that exist (not padding, row active); None: all of them.
    reset [B, Lb]: tokens that start a new document (recurrent kinds zero their state before
      them; None: none does). Sequence mode: `document_starts(base)`, computed once per forward.
    out_index [B, T_out]: sequence mode, the array index into the base stream of each output
      copy's token (SFT's output positions); None when the output stream is the base stream
      itself (PT), aligned with it token for token.
    default_positions: sequence mode with positions = arange and one segment (lets an attention
      implementation use its built-in causal / window masks).
    draft_window: a self-speculative draft (docs/speculative.md): the output copies read only
      the last draft_window keys (sequence mode: a window mask; cached modes: the view's
      global_slots) and use the draft scale-offsets where the model has them.
    """

    mode: Mode = flax.struct.field(pytree_node=False)
    impl: AttentionImpl | str | None = flax.struct.field(pytree_node=False, default=None)
    view: CacheView | None = None
    valid: jax.Array | None = None
    reset: jax.Array | None = None
    out_index: jax.Array | None = None
    default_positions: bool = flax.struct.field(pytree_node=False, default=False)
    draft_window: int | None = flax.struct.field(pytree_node=False, default=None)


Initializer = Callable[..., jax.Array]


class Role(enum.Enum):
    """What a parameter is to the trainable subsets (training/trainable.py): a scale-offset
    vector (`train.trainable="scale_offset"` trains these alone), a LoRA adapter factor
    (layers/lora.py; "lora" trains these and the scale-offsets) or any other weight."""

    WEIGHT = "weight"
    SCALE_OFFSET = "scale_offset"
    ADAPTER = "adapter"


@dataclasses.dataclass(frozen=True)
class ParamDecl:
    """One per-layer parameter (without the stack's leading layers axis): its shape, logical
    axes, whether AdamW decays it (training/optimizer.py's mask reads this), its initializer
    (key, shape, dtype) -> array, its Role, and adapter_in: > 0 for a projection that may
    carry a LoRA adapter, the number of its leading axes that are its input side (wq
    [D, N, H]: 1; wo [N, H, D]: 2), so the adapter is A [*in, r] @ B [r, *out]. fill_from: the
    parameter of the same kind whose value it takes when a checkpoint lacks it
    (stack.fill_identity_so; "" = the identity)."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    decay: bool
    init: Initializer
    role: Role = Role.WEIGHT
    adapter_in: int = 0
    fill_from: str = ""


def matrix(
    shape: tuple[int, ...], axes: tuple[str | None, ...], std: float, adapter_in: int = 0
) -> ParamDecl:
    """A projection: normal(std), weight-decayed; adapter_in > 0: it may carry a LoRA adapter
    over its first adapter_in axes (ParamDecl.adapter_in)."""
    return ParamDecl(shape, axes, True, nn.initializers.normal(std), adapter_in=adapter_in)


def vector(shape: tuple[int, ...], axes: tuple[str | None, ...], init: Initializer) -> ParamDecl:
    """A gain, bias, offset, conv tap or other non-matrix parameter: not weight-decayed."""
    return ParamDecl(shape, axes, False, init)


def gain(shape: tuple[int, ...], axes: tuple[str | None, ...], cfg: ModelConfig) -> ParamDecl:
    """A norm weight of the model's convention: 1 (0 when zero-centred), not decayed."""
    init = nn.initializers.zeros if cfg.norm_zero_centered else nn.initializers.ones
    return vector(shape, axes, init)


def scale_offsets(
    names: tuple[str, str],
    shape: tuple[int, ...],
    axes: tuple[str | None, ...],
    fill_from: tuple[str, str] = ("", ""),
) -> dict[str, ParamDecl]:
    """A query scale-offset (scale 1, offset 0): per-head affine gains, not decayed (decay
    would pull the scale towards 0, not towards the identity). fill_from: the (scale, offset)
    a checkpoint lacking them copies (ParamDecl.fill_from)."""
    scale, offset = names
    so = lambda init, src: ParamDecl(
        shape, axes, False, init, role=Role.SCALE_OFFSET, fill_from=src
    )
    return {
        scale: so(nn.initializers.ones, fill_from[0]),
        offset: so(nn.initializers.zeros, fill_from[1]),
    }


# The export formats: transformers' own classes, flash-linear-attention's, trust_remote_code.
HF, FLA, REMOTE = "hf", "fla", "remote"
FORMATS = (HF, FLA, REMOTE)


@dataclasses.dataclass(frozen=True)
class Export:
    """How a kind's layers leave the library, per format (convert/ maps each name to its
    tensors): hf, the layer type in transformers' configs (Llama / Qwen3: "full_attention";
    Qwen3.5: "full_attention" / "linear_attention"); remote, the layer type in
    modeling_orthros.py's config.json; fla, the fla model_type of a pure stack of the kind.
    None: the format has no such layer, and an export to it is refused, saying `note`."""

    hf: str | None = None
    remote: str | None = None
    fla: str | None = None
    note: str = ""

    def name(self, fmt: str) -> str | None:
        if fmt not in FORMATS:
            raise ValueError(f"export format {fmt!r} is unknown; allowed: {', '.join(FORMATS)}")
        return getattr(self, fmt)

    def formats(self) -> tuple[str, ...]:
        return tuple(f for f in FORMATS if getattr(self, f) is not None)


@dataclasses.dataclass(frozen=True)
class Work:
    """What one layer computes in one call, for analytic FLOP counts (multiply-add = 2).

    tokens: base tokens that write their state (a prompt: T; PT: T; decode: 1), at positions
    context - tokens .. context - 1. base_outputs: how many of them need the layer's output
    (all, the last one, or 0 when the base stream is dead). copies: output-stream copies run
    (two-stream arms), each at one of those positions: `tokens` copies (PT) or the last one.
    ffn: FLOPs per token of this layer's FFN (layers/ffn.layer_flops: the dense SwiGLU or the
    layer's FFN choice), spent by each base output and copy of a kind whose block has an FFN.
    """

    tokens: int
    context: int
    base_outputs: int
    copies: int
    ffn: int


# What a layer step returns: (base, out, state).
StepOut = tuple[Stream | None, Stream | None, KindState]


class StepFn(Protocol):
    """A kind's one layer step (the only definition of its signature; a kind's `step`
    function, attention.step or recurrent.RecurrentStep, is checked against it by `Kind`)."""

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
        """One layer for both streams in ctx.mode. p: this layer's parameters; base / out:
        Stream | None (out: the output stream's copies); state: the kind's whole stacked cache
        state (None in sequence mode), written at layer index li; compute_base=False skips the
        base stream's mixing and FFN (dead in the last layer). Returns (base, out, state)."""
        ...


@runtime_checkable
class LayerKind(Protocol):
    """A kind of layer: everything the model, the drivers, the cache, the shardings, FLOP and
    parameter counts need to know of it. `params_key` names its parameter stack in the model's
    tree (stacked on a leading axis over the layers of that kind)."""

    @property
    def name(self) -> str: ...

    @property
    def params_key(self) -> str: ...

    @property
    def reads_last_token(self) -> bool:
        """Can `read` mode run a base token alone (a single-stream arm's last prompt token)?"""
        ...

    @property
    def recurrent(self) -> bool:
        """Is its cache state a recurrent state (fixed size, not K/V over slots)? A hybrid's
        recurrent layers may be of any recurrent kind; sequence parallelism splits only the
        others' K/V over slots."""
        ...

    @property
    def options(self) -> type[Options] | None:
        """Its section of ModelConfig.kinds (None: it has no options of its own)."""
        ...

    @property
    def export(self) -> Export: ...

    def num_params(self, cfg: ModelConfig) -> int: ...

    def params(self, cfg: ModelConfig) -> dict[str, ParamDecl]:
        """Every per-layer parameter under cfg, in creation order (the stack's init keys)."""
        ...

    def init_state(
        self, cfg: ModelConfig, n_layers: int, batch: int, max_len: int, dtype: jnp.dtype
    ) -> KindState: ...

    def state_axes(self, cfg: ModelConfig) -> StateAxes: ...

    @property
    def step(self) -> StepFn: ...

    def flops(self, cfg: ModelConfig, work: Work) -> int: ...

    def validate(self, cfg: ModelConfig) -> None: ...


def no_checks(cfg: ModelConfig) -> None:
    """A kind without config checks of its own."""


@dataclasses.dataclass(frozen=True)
class Kind:
    """A LayerKind built from a kind module's functions (one registry entry)."""

    name: str
    params_key: str
    params: Callable[[ModelConfig], dict[str, ParamDecl]]
    init_state: Callable[[ModelConfig, int, int, int, jnp.dtype], KindState]  # cfg, layers, B, S
    state_axes: Callable[[ModelConfig], StateAxes]
    step: StepFn
    flops: Callable[[ModelConfig, Work], int]
    recurrent: bool
    export: Export
    validate: Callable[[ModelConfig], None] = no_checks
    options: type[Options] | None = None
    reads_last_token: bool = True

    def num_params(self, cfg: ModelConfig) -> int:
        """Parameters of one layer of this kind under cfg."""
        return sum(math.prod(d.shape) for d in self.params(cfg).values())


def block_params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """The parts of a layer every kind shares: the two pre-norms and, without ModelConfig.moe,
    the dense SwiGLU FFN (with moe the FFN has its own stacks: layers/ffn.py)."""
    d = cfg.d_model
    decls = {"attn_norm": gain((d,), (EMBED,), cfg), "mlp_norm": gain((d,), (EMBED,), cfg)}
    return decls | (dense_ffn_params(cfg) if cfg.moe is None else {})


def dense_ffn_params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """The dense SwiGLU FFN's parameters (d_ff wide; its output depth-scaled, residual_std)."""
    d, f = cfg.d_model, cfg.d_ff
    return {
        "w_gate": matrix((d, f), (EMBED, MLP), cfg.init_std, adapter_in=1),
        "w_up": matrix((d, f), (EMBED, MLP), cfg.init_std, adapter_in=1),
        "w_down": matrix((f, d), (MLP, EMBED), residual_std(cfg), adapter_in=1),
    }


def norm(p: Params, x: jax.Array, name: str, cfg: ModelConfig) -> jax.Array:
    """A pre-norm of the layer (RMSNorm; scale 1 + w with cfg.norm_zero_centered)."""
    return nnl.rms_norm(x, p[name], cfg.norm_eps, zero_centered=cfg.norm_zero_centered)


def residual_std(cfg: ModelConfig) -> float:
    """Init std of a residual branch's output projection: init_std / sqrt(2 * layers) (GPT-2)."""
    return cfg.init_std / (2 * cfg.n_layers) ** 0.5


def layer_of(state: KindState, li: LayerIndex) -> KindState:
    """Layer li's entry of a kind's stacked state (every leaf [layers, ...] -> [...])."""
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, li, keepdims=False), state)


def with_layer(state: KindState, li: LayerIndex, new: KindState) -> KindState:
    """The stacked state with layer li's entry replaced by `new` (cast to each leaf's dtype)."""
    put = lambda a, x: jax.lax.dynamic_update_index_in_dim(a, x.astype(a.dtype), li, 0)
    return jax.tree.map(put, state, new)


def document_starts(stream: Stream) -> jax.Array:
    """[B, L] True where a packed document starts: the first token, a segment change, or a
    position that does not increase over the previous token's."""
    seg, pos = stream.segment_ids, stream.positions
    starts = (seg[:, 1:] != seg[:, :-1]) | (pos[:, 1:] <= pos[:, :-1])
    return jnp.concatenate([jnp.ones_like(seg[:, :1], bool), starts], axis=1)
