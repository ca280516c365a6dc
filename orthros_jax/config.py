"""Model configuration: one frozen dataclass, validated on construction.

`ModelConfig` is the only thing the model, the attention kernels and the inference
functions read. Launchers build it from an `ml_collections` config with
`ModelConfig.from_dict`, which rejects unknown keys by name.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax.numpy as jnp

Architecture = Literal[
    "orthros", "transformer", "swa", "gdn", "hybrid", "orthros_h", "gla", "retnet"
]


@dataclasses.dataclass(frozen=True)
class Arm:
    """One of the paper's arms, as data: the layer kinds it is made of and how it attends.

    layer_types: the default cycle of kinds; kinds: the set every cycle of this arm must use;
    two_streams: an Orthros output stream (per-stream query SO by default); base_window: the
    base stream's attention is the sliding window (else causal over every key)."""

    layer_types: tuple[str, ...]
    kinds: frozenset[str]
    two_streams: bool = False
    base_window: bool = False
    # A hybrid: its "gdn" layers may be of any recurrent kind (RECURRENT_KINDS), e.g. a
    # (gla, attention) or (retention, gdn, attention) cycle.
    any_recurrent: bool = False


def _arm(cycle: tuple[str, ...], **flags: bool) -> Arm:
    return Arm(cycle, frozenset(cycle), **flags)


# The kinds with a recurrent state (no K/V over slots), interchangeable in a hybrid's cycle.
RECURRENT_KINDS: frozenset[str] = frozenset({"gdn", "gla", "retention"})


# The hybrids use Qwen3.5's cycle of three GDN layers and one attention layer.
ARMS: dict[str, Arm] = {
    "orthros": _arm(("attention",), two_streams=True, base_window=True),
    "transformer": _arm(("attention",)),
    "swa": _arm(("attention",), base_window=True),
    "gdn": _arm(("gdn",)),
    "hybrid": _arm(("gdn", "gdn", "gdn", "attention"), any_recurrent=True),
    "orthros_h": _arm(
        ("gdn", "gdn", "gdn", "attention"), two_streams=True, base_window=True, any_recurrent=True
    ),
    # Table 1's other linear baselines (fla's GLA and RetNet), pure stacks.
    "gla": _arm(("gla",)),
    "retnet": _arm(("retention",)),
}
ARCHITECTURES: tuple[str, ...] = tuple(ARMS)
TWO_STREAM_ARCHITECTURES: tuple[str, ...] = tuple(a for a, arm in ARMS.items() if arm.two_streams)
DEFAULT_LAYER_TYPES: dict[str, tuple[str, ...]] = {a: arm.layer_types for a, arm in ARMS.items()}
REMAT_POLICIES: tuple[str, ...] = ("none", "full", "dots")
ROPE_TYPES: tuple[str, ...] = ("default", "llama3")
# The layer kinds and the attention implementations, registered by orthros_jax.layers (its
# registry and attend modules; the package's __init__ imports them, so they are always here):
# ModelConfig checks layer_types and attention_impl against them and runs each used kind's own
# checks of its fields. config.py itself imports nothing of the package.
KIND_CHECKS: dict[str, Callable[[ModelConfig], None]] = {}
ATTENTION_IMPLS: list[str] = []


def register_layer_kind(name: str, validate: Callable[[ModelConfig], None]) -> None:
    """Makes `name` a valid entry of layer_types; validate(cfg) raises ValueError for fields of
    that kind that do not fit."""
    KIND_CHECKS[name] = validate


def register_attention_impl(name: str) -> None:
    """Makes `name` a valid attention_impl."""
    if name not in ATTENTION_IMPLS:
        ATTENTION_IMPLS.append(name)


DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes an Orthros / Transformer / SWA / GDN / Linear Hybrid / Orthros-H
    model's shapes and math.

    Shapes use the letters of docs/contributing.md: V vocab, D d_model, N query heads, K kv heads,
    H head_dim, F d_ff, W window; the stacked layers axis is written `layers`.
    """

    vocab_size: int = 256
    d_model: int = 128
    # 4: a multiple of every arm's default cycle (the hybrids' is four layers long).
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 384
    window: int = 128
    architecture: Architecture = "orthros"
    # Per-stream query scale-offset; None = the arm's default (on for the two-stream arms).
    scale_offset: bool | None = None
    # The repeating cycle of layer kinds (n_layers must be a multiple of its length); () =
    # the arm's default (ARMS).
    layer_types: tuple[str, ...] = ()  # () or None: the arm's default
    rope_theta: float = 10_000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    norm_eps: float = 1e-6
    qk_norm: bool = False
    # Qwen3.5 attention conventions: a sigmoid output gate (its own query-shaped projection),
    # RoPE on a fraction of head_dim, RMSNorm weights stored zero-centred (scale 1 + w).
    attn_output_gate: bool = False
    partial_rotary_factor: float = 1.0
    norm_zero_centered: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = True
    remat: str = "none"
    # Blocking of the memory-bounded global attention (queries x keys per step).
    attention_block_q: int = 512
    attention_block_k: int = 512
    # Query block of the sliding-window attention (capped at the window); each block reads
    # 1 + ceil((w-1)/b) key blocks. Smaller blocks read fewer masked keys, larger ones give the
    # backend bigger dots to spread over threads; the best size is the backend's
    # (docs/performance.md: 128 under default XLA:CPU on 2 cores, 64 with multi-threaded dots).
    attention_block_local: int = 64
    # Prefill processes prompts in chunks of this many tokens (memory = cache + O(chunk*D)).
    prefill_chunk: int = 2048
    attention_impl: str = "xla"
    init_std: float = 0.02
    # Gated DeltaNet layers (gdn.py; Qwen3.5's linear_* fields): key/value heads and their head
    # dims, the causal conv kernel, and the chunk of the chunked delta rule.
    gdn_num_k_heads: int = 2
    gdn_num_v_heads: int = 4
    gdn_k_head_dim: int = 32
    gdn_v_head_dim: int = 32
    gdn_conv_kernel: int = 4
    gdn_chunk: int = 64
    # GLA layers (layers/gla.py; fla's GatedLinearAttention): heads, kv heads (repeated to the
    # heads), key / value head dims (fla: hidden * expand_k / heads, hidden * expand_v / heads),
    # the low-rank decay gate (rank, logit normalizer, optional clamp_min), the optional short
    # conv on q/k/v, feature map on q/k, the swish output gate, the norm's weight
    # (elementwise_affine) and the kernel's chunk.
    gla_heads: int = 4
    gla_kv_heads: int = 4
    gla_k_head_dim: int = 16
    gla_v_head_dim: int = 32
    gla_gate_rank: int = 16
    gla_gate_normalizer: float = 16.0
    gla_clamp_min: float | None = None
    gla_short_conv: bool = False
    gla_conv_kernel: int = 4
    gla_feature_map: str | None = None
    gla_output_gate: bool = True
    gla_norm_affine: bool = True
    gla_chunk: int = 64
    # Retention layers (layers/retention.py, the retnet arm; fla's MultiScaleRetention): the
    # same without the decay gate and conv; decay 1 - 2^(-5-h) per head, rotary over the key dim.
    retention_heads: int = 8
    retention_kv_heads: int = 8
    retention_k_head_dim: int = 16
    retention_v_head_dim: int = 32
    retention_feature_map: str | None = None
    retention_output_gate: bool = True
    retention_norm_affine: bool = True
    retention_chunk: int = 64

    def __post_init__(self) -> None:
        if self.scale_offset is None:
            object.__setattr__(self, "scale_offset", self.architecture in TWO_STREAM_ARCHITECTURES)
        if not self.layer_types:  # None or (): the arm's default
            object.__setattr__(self, "layer_types", DEFAULT_LAYER_TYPES.get(self.architecture, ()))
        if isinstance(self.layer_types, list):
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        positive = (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "d_ff",
            "window",
            "attention_block_q",
            "attention_block_k",
            "attention_block_local",
            "prefill_chunk",
            "gdn_num_k_heads",
            "gdn_num_v_heads",
            "gdn_k_head_dim",
            "gdn_v_head_dim",
            "gdn_conv_kernel",
            "gdn_chunk",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"ModelConfig.architecture={self.architecture!r} is unknown; "
                f"allowed: {', '.join(ARCHITECTURES)}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads={self.n_heads} must be divisible by "
                f"n_kv_heads={self.n_kv_heads} (grouped-query attention)"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.head_dim={self.head_dim} must be even (RoPE rotates pairs)"
            )
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"ModelConfig.remat={self.remat!r} is unknown; allowed: {', '.join(REMAT_POLICIES)}"
            )
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"ModelConfig.rope_type={self.rope_type!r} is unknown; allowed: {', '.join(ROPE_TYPES)}"
            )
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(
                f"ModelConfig.attention_impl={self.attention_impl!r} is unknown; "
                f"allowed: {', '.join(ATTENTION_IMPLS)}"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"ModelConfig.{name}={getattr(self, name)!r} is unknown; allowed: {', '.join(DTYPES)}"
                )
        for name in ("rope_theta", "norm_eps", "rope_factor", "init_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ModelConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not self.layer_types or any(k not in KIND_CHECKS for k in self.layer_types):
            raise ValueError(
                f"ModelConfig.layer_types={self.layer_types!r}: a non-empty cycle of kinds from "
                f"{', '.join(KIND_CHECKS)}"
            )
        if self.n_layers % len(self.layer_types):
            raise ValueError(
                f"ModelConfig.n_layers={self.n_layers} must be a multiple of the layer_types "
                f"cycle length {len(self.layer_types)}"
            )
        if not 0 < self.partial_rotary_factor <= 1 or self.rope_dim < 1:
            raise ValueError(
                f"ModelConfig.partial_rotary_factor={self.partial_rotary_factor} must be in (0, 1] "
                f"and leave at least one rotary dim: int(head_dim={self.head_dim} * factor) >= 1"
            )
        if self.scale_offset and not self.two_streams:
            raise ValueError(
                f"ModelConfig.scale_offset=True needs a two-stream architecture "
                f"({', '.join(TWO_STREAM_ARCHITECTURES)}), got {self.architecture!r}; the "
                "single-stream arms have no query scale-offset"
            )
        self._check_layer_types_of_arm()
        for kind in dict.fromkeys(self.layer_types):
            KIND_CHECKS[kind](self)

    def _check_layer_types_of_arm(self) -> None:
        """Every cycle of an arm uses exactly the arm's kinds (ARMS); a hybrid's recurrent kinds
        may be any of RECURRENT_KINDS."""
        arm, kinds = ARMS[self.architecture], set(self.layer_types)
        recurrent = kinds - {"attention"}
        if (
            arm.any_recurrent
            and "attention" in kinds
            and recurrent
            and recurrent <= RECURRENT_KINDS
        ):
            return
        if kinds != arm.kinds:
            needs = (f"needs both 'gdn' and 'attention' layers (any of {sorted(RECURRENT_KINDS)} "
                     "may stand for gdn)" if arm.any_recurrent
                     else f"needs only {next(iter(arm.kinds))!r} layers" if len(arm.kinds) == 1
                     else f"needs exactly the kinds {sorted(arm.kinds)}")  # fmt: skip
            raise ValueError(
                f"ModelConfig.layer_types={self.layer_types!r} does not fit architecture "
                f"{self.architecture!r}, which {needs} (e.g. {arm.layer_types!r}, the default)"
            )

    @property
    def rope_dim(self) -> int:
        """The dim RoPE's frequencies are computed for, int(head_dim * partial_rotary_factor) as
        in transformers: frequencies theta^(-2i / rope_dim), i < ceil(rope_dim / 2)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each head that RoPE rotates: two per frequency (rope_dim rounded up
        to even, e.g. head_dim 12 at factor 0.25: rope_dim 3, rotary_dim 4)."""
        return 2 * -(-self.rope_dim // 2)

    @property
    def base_window(self) -> int | None:
        """The base stream's window (None: causal over every key, the Transformer arm and the
        Linear Hybrid's full-attention layers)."""
        return self.window if ARMS[self.architecture].base_window else None

    @property
    def n_cycles(self) -> int:
        return self.n_layers // len(self.layer_types)

    def layers_of(self, kind: str) -> int:
        """How many layers of a kind the stack has."""
        return self.n_cycles * self.layer_types.count(kind)

    def layer_index(self, c: Any, j: int) -> Any:
        """Index in its kind's stack of the layer at position j of cycle c: c * count + rank,
        count = how often the kind occurs in the cycle, rank = its occurrences before j. c may
        be a traced int (the layer loop's scan counter)."""
        kind = self.layer_types[j]
        return c * self.layer_types.count(kind) + self.layer_types[:j].count(kind)

    def layer_slots(self) -> tuple[tuple[str, int], ...]:
        """(kind, index in the kind's stack) of every layer of the model, in order."""
        n = len(self.layer_types)
        return tuple(
            (self.layer_types[j], self.layer_index(c, j))
            for c in range(self.n_cycles)
            for j in range(n)
        )

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def jnp_param_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def two_streams(self) -> bool:
        return ARMS[self.architecture].two_streams

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Builds a config from a mapping (e.g. an ml_collections ConfigDict), naming unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            hints = [
                f"{k!r} (did you mean {close[0]!r}?)"
                if (close := difflib.get_close_matches(k, known, 1))
                else repr(k)
                for k in unknown
            ]
            raise ValueError(
                f"unknown ModelConfig field(s) {', '.join(hints)}; valid fields: "
                f"{', '.join(sorted(known))}"
            )
        return cls(**dict(values))
