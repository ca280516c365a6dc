"""Model configuration: one frozen dataclass, validated on construction.

`ModelConfig` is the only thing the model, the attention kernels and the inference
functions read. Launchers build it from an `ml_collections` config with
`ModelConfig.from_dict`, which rejects unknown keys by name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import jax.numpy as jnp

from orthros_jax.gdn import gdn_param_shapes

Architecture = Literal["orthros", "transformer", "swa", "gdn", "hybrid", "orthros_h"]
ARCHITECTURES: tuple[str, ...] = ("orthros", "transformer", "swa", "gdn", "hybrid", "orthros_h")
# The arms with an Orthros output stream (per-stream query SO by default).
TWO_STREAM_ARCHITECTURES: tuple[str, ...] = ("orthros", "orthros_h")
# Each arm's layer_types when none is given: attention arms all attention, gdn all GDN, the
# hybrids Qwen3.5's cycle of three GDN layers and one attention layer.
DEFAULT_LAYER_TYPES: dict[str, tuple[str, ...]] = {
    "orthros": ("attention",),
    "transformer": ("attention",),
    "swa": ("attention",),
    "gdn": ("gdn",),
    "hybrid": ("gdn", "gdn", "gdn", "attention"),
    "orthros_h": ("gdn", "gdn", "gdn", "attention"),
}
REMAT_POLICIES: tuple[str, ...] = ("none", "full", "dots")
ROPE_TYPES: tuple[str, ...] = ("default", "llama3")
# How to attend (attend.py): blocked XLA kernels, jax.nn.dot_product_attention's XLA lowering,
# jax's Pallas splash kernels (TPU), or cuDNN flash attention (NVIDIA GPU, bf16/fp16).
ATTENTION_IMPLS: tuple[str, ...] = ("xla", "dot_product", "splash", "cudnn")
LAYER_KINDS: tuple[str, ...] = ("attention", "gdn")
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes an Orthros / Transformer / SWA / GDN / Linear Hybrid / Orthros-H
    model's shapes and math.

    Shapes use the letters of the README: V vocab, D d_model, N query heads, K kv heads,
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
    # The repeating cycle of layer kinds (n_layers must be a multiple of its length); None =
    # the arm's DEFAULT_LAYER_TYPES. gdn: all "gdn"; hybrid / orthros_h: both kinds;
    # orthros / transformer / swa: all "attention".
    layer_types: tuple[str, ...] | None = None
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

    def __post_init__(self) -> None:
        if self.scale_offset is None:
            object.__setattr__(self, "scale_offset", self.architecture in TWO_STREAM_ARCHITECTURES)
        if self.layer_types is None:
            object.__setattr__(
                self, "layer_types", DEFAULT_LAYER_TYPES.get(self.architecture, ("attention",))
            )
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
        if not self.layer_types or any(k not in LAYER_KINDS for k in self.layer_types):
            raise ValueError(
                f"ModelConfig.layer_types={self.layer_types!r}: a non-empty cycle of kinds from "
                f"{', '.join(LAYER_KINDS)}"
            )
        if self.n_layers % len(self.layer_types):
            raise ValueError(
                f"ModelConfig.n_layers={self.n_layers} must be a multiple of the layer_types "
                f"cycle length {len(self.layer_types)}"
            )
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2:
            raise ValueError(
                f"ModelConfig.partial_rotary_factor={self.partial_rotary_factor} must be in (0, 1] "
                f"and give an even rotary dim (head_dim={self.head_dim})"
            )
        if self.scale_offset and not self.two_streams:
            raise ValueError(
                f"ModelConfig.scale_offset=True needs a two-stream architecture "
                f"({', '.join(TWO_STREAM_ARCHITECTURES)}), got {self.architecture!r}; the "
                "single-stream arms have no query scale-offset"
            )
        if self.gdn_num_v_heads % self.gdn_num_k_heads:
            raise ValueError(
                f"ModelConfig.gdn_num_v_heads={self.gdn_num_v_heads} must be a multiple of "
                f"gdn_num_k_heads={self.gdn_num_k_heads} (each key head serves Hv/Hk consecutive "
                "value heads)"
            )
        self._check_layer_types_of_arm()

    def _check_layer_types_of_arm(self) -> None:
        """gdn: every layer GDN; hybrid / orthros_h: both kinds; the others: attention only."""
        kinds = set(self.layer_types)
        arch = self.architecture
        if arch == "gdn":
            ok, want = kinds == {"gdn"}, "only 'gdn' layers"
        elif arch in ("hybrid", "orthros_h"):
            ok, want = kinds == {"gdn", "attention"}, "both 'gdn' and 'attention' layers"
        else:
            ok, want = kinds == {"attention"}, "only 'attention' layers"
        if not ok:
            raise ValueError(
                f"ModelConfig.layer_types={self.layer_types!r} does not fit architecture "
                f"{arch!r}, which needs {want} (e.g. {DEFAULT_LAYER_TYPES[arch]!r}, the default)"
            )

    @property
    def rotary_dim(self) -> int:
        """Leading dims of each head that RoPE rotates."""
        return int(round(self.head_dim * self.partial_rotary_factor))

    @property
    def base_window(self) -> int | None:
        """The base stream's window (None: causal over every key, the Transformer arm and the
        Linear Hybrid's full-attention layers)."""
        return None if self.architecture in ("transformer", "hybrid") else self.window

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
        return self.architecture in TWO_STREAM_ARCHITECTURES

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
            raise ValueError(
                f"unknown ModelConfig field(s) {unknown}; valid fields: {', '.join(sorted(known))}"
            )
        return cls(**dict(values))

    def num_params(self) -> int:
        """Parameter count (embeddings and head included)."""
        d, n, k, h, f, v = (
            self.d_model,
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
            self.d_ff,
            self.vocab_size,
        )
        block = 3 * d * f + 2 * d
        per_layer = d * n * h + 2 * d * k * h + n * h * d + block
        if self.attn_output_gate:
            per_layer += d * n * h
        if self.qk_norm:
            per_layer += 2 * h
        if self.scale_offset:
            per_layer += 4 * n * h
        per_gdn = block + sum(math.prod(s) for s, _ in gdn_param_shapes(self).values())
        if self.scale_offset:
            per_gdn += 2 * self.gdn_num_k_heads * self.gdn_k_head_dim  # the cross query's SO
        head = 0 if self.tie_embeddings else d * v
        layers = self.layers_of("attention") * per_layer + self.layers_of("gdn") * per_gdn
        return v * d + layers + d + head
