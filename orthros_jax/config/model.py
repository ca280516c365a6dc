"""Model configuration: one frozen dataclass, checked on construction.

`ModelConfig` is the only thing the model, the attention kernels and the inference
functions read. Launchers build it from an `ml_collections` config with
`ModelConfig.from_dict`, which rejects unknown keys by name. Construction checks what the
config can check alone (types, ranges, relations between its fields) and fills the defaults of
its architecture (architectures.py); what needs the registry (the kinds and FFN choices exist
and fit, each used kind's own checks, the attention implementation exists) is
layers/registry.validate, run where a model is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from orthros_jax.config.architectures import (
    ARCHITECTURES,
    DEFAULT_ARCHITECTURE,
    TWO_STREAM_ARCHITECTURES,
    Architecture,
)
from orthros_jax.config.kinds import Sections
from orthros_jax.config.lora import LoRAOptions
from orthros_jax.config.moe import MoEOptions
from orthros_jax.config.options import (
    check_choice,
    check_positive,
    check_positive_int,
    unknown_keys,
)

REMAT_POLICIES: tuple[str, ...] = ("none", "full", "dots")
ROPE_TYPES: tuple[str, ...] = ("default", "llama3")
# ModelConfig fields that change how the model runs, not the function its weights compute (a
# resumed run may change them; the kinds' options say so of theirs).
RUNTIME_FIELDS = frozenset(
    {
        "dtype",
        "scan_layers",
        "remat",
        "attention_block_q",
        "attention_block_k",
        "attention_block_local",
        "attention_block_cache_kib",
        "prefill_chunk",
        "attention_impl",
        "init_std",
    }
)

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
    architecture: str = DEFAULT_ARCHITECTURE  # a name of architectures.ARCHITECTURES
    # Per-stream query scale-offset; None = the architecture's default (on for two streams).
    scale_offset: bool | None = None
    # Draft scale-offsets (docs/speculative.md): a third query SO per attention layer that only
    # a self-speculative draft step's windowed output copy reads; trained by distillation
    # (configs/draft_so.py). Needs scale_offset on a two-stream architecture.
    draft_scale_offset: bool = False
    # The repeating cycle of layer kinds (n_layers must be a multiple of its length); () or
    # None = the architecture's default cycle.
    layer_types: tuple[str, ...] = ()
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
    # KiB of one K (or V) block of a few queries' read over the cache on CPU (decode, a verify
    # pass): blocks of every row's slots sliced straight out of the layer stack, up to the
    # longest row's last key (kernels/few_queries.few_query_stacked; docs/performance.md:
    # 1-2 MiB, about a core's L2, was best on this CPU at batch 1, 4 and 8).
    attention_block_cache_kib: int = 2048
    # Prefill processes prompts in chunks of this many tokens (memory = cache + O(chunk*D)).
    prefill_chunk: int = 2048
    attention_impl: str = "xla"
    init_std: float = 0.02
    # Each layer kind's own options, a section per kind (kinds.Sections):
    # cfg.kinds.gdn.chunk. Built from a mapping kind -> Options or -> dict of options.
    kinds: Sections = dataclasses.field(default_factory=Sections)
    # The mixture-of-experts FFN (moe.MoEOptions, or a dict of its options); None:
    # every layer's FFN is the dense SwiGLU (d_ff) in its kind's parameters. An option group:
    # a field whose metadata names its options dataclass (from_dict, to_dict, RUNTIME_FIELDS),
    # serialised and flattened as "<field>.<option>" by the generic code below.
    moe: MoEOptions | None = dataclasses.field(default=None, metadata={"options": MoEOptions})
    # LoRA adapters on the kinds' declared projections (config/lora.LoRAOptions, or a dict of
    # its options; layers/lora.py); None: no adapters. An option group like moe.
    lora: LoRAOptions | None = dataclasses.field(default=None, metadata={"options": LoRAOptions})

    def __post_init__(self) -> None:
        for name, group in _option_groups():
            if isinstance(getattr(self, name), Mapping):
                object.__setattr__(self, name, group.from_dict(getattr(self, name), name))
        check_choice("ModelConfig.architecture", self.architecture, ARCHITECTURES)
        if self.scale_offset is None:
            object.__setattr__(self, "scale_offset", self.two_streams)
        if not self.layer_types:  # None or (): the architecture's default
            object.__setattr__(self, "layer_types", self.arch.layer_types)
        if isinstance(self.layer_types, list):
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if not isinstance(self.kinds, Sections):
            object.__setattr__(self, "kinds", Sections(self.kinds))
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
            "attention_block_cache_kib",
            "prefill_chunk",
        )
        for name in positive:
            check_positive_int(f"ModelConfig.{name}", getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads={self.n_heads} must be divisible by "
                f"n_kv_heads={self.n_kv_heads} (grouped-query attention)"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"ModelConfig.head_dim={self.head_dim} must be even (RoPE rotates pairs)"
            )
        check_choice("ModelConfig.remat", self.remat, REMAT_POLICIES)
        check_choice("ModelConfig.rope_type", self.rope_type, ROPE_TYPES)
        if not isinstance(self.attention_impl, str) or not self.attention_impl:
            raise ValueError(
                f"ModelConfig.attention_impl={self.attention_impl!r} must name an implementation"
            )
        for name in ("dtype", "param_dtype"):
            check_choice(f"ModelConfig.{name}", getattr(self, name), DTYPES)
        for name in ("rope_theta", "norm_eps", "rope_factor", "init_std"):
            check_positive(f"ModelConfig.{name}", getattr(self, name))
        if not all(isinstance(k, str) for k in self.layer_types):
            raise ValueError(
                f"ModelConfig.layer_types={self.layer_types!r}: a non-empty cycle of kind names"
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
                "single-stream architectures have no query scale-offset"
            )
        if self.draft_scale_offset and not (self.two_streams and self.scale_offset):
            raise ValueError(
                "ModelConfig.draft_scale_offset=True needs a two-stream architecture with "
                f"scale_offset=True (the draft copies the output stream's SO), got "
                f"architecture={self.architecture!r}, scale_offset={self.scale_offset}"
            )
        if self.moe is not None:
            # The FFN cycle and the kind cycle repeat together: layer_types is extended to
            # their least common multiple (the same stack; MoEOptions.layer_cycle).
            self.moe.resolved_routing(self.two_streams)
            cycle = self.moe.layer_cycle(self.layer_types, self.n_layers)
            object.__setattr__(self, "layer_types", cycle)

    @property
    def arch(self) -> Architecture:
        """The architecture's row of architectures.ARCHITECTURES (its streams, default cycle)."""
        return ARCHITECTURES[self.architecture]

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
        return self.window if self.arch.base_window else None

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
        return _index_in_stack(self.layer_types, c, j)

    def layer_slots(self) -> tuple[tuple[str, int], ...]:
        """(kind, index in the kind's stack) of every layer of the model, in order."""
        n = len(self.layer_types)
        return tuple(
            (self.layer_types[j], self.layer_index(c, j))
            for c in range(self.n_cycles)
            for j in range(n)
        )

    @property
    def ffn_types(self) -> tuple[str, ...]:
        """The FFN choice (a name of layers/ffn.FFNS) of each position of the layer cycle;
        () without moe: the dense FFN lives in the kinds' parameters."""
        return () if self.moe is None else self.moe.ffn_types(len(self.layer_types))

    def ffn_layers(self, ffn: str) -> int:
        """How many layers have this FFN choice (0 without moe)."""
        return self.n_cycles * self.ffn_types.count(ffn)

    def ffn_index(self, c: Any, j: int) -> Any:
        """Index in its FFN's stack of the FFN at position j of cycle c (like layer_index)."""
        return _index_in_stack(self.ffn_types, c, j)

    @property
    def moe_routing(self) -> str | None:
        """The output copies' routing ("paired" / "independent"); None without moe."""
        return None if self.moe is None else self.moe.resolved_routing(self.two_streams)

    @property
    def jnp_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def jnp_param_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def two_streams(self) -> bool:
        return self.arch.two_streams

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes`; kinds= changes only the sections and options it names
        (kind -> dict of options, or kind -> Options for the whole section)."""
        if "kinds" in changes:
            changes["kinds"] = self.kinds.merged(changes["kinds"])
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field; kinds as {kind: {option: value}}, an option group (moe) as {option:
        value} or None (model.json, ml_collections)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["kinds"] = self.kinds.to_dict()
        for name, _ in _option_groups():
            out[name] = None if out[name] is None else out[name].to_dict()
        return out

    def runtime_keys(self) -> frozenset[str]:
        """The keys of flat() that change how the model runs, not what its weights compute."""
        kinds = {f"kinds.{k}.{n}" for k, o in self.kinds.items() for n in o.runtime_fields()}
        groups = {
            f"{name}.{n}"
            for name, group in _option_groups()
            if getattr(self, name) is not None
            for n in group.RUNTIME_FIELDS
        }
        return RUNTIME_FIELDS | kinds | groups

    def flat(self) -> dict[str, Any]:
        """Every field, the kinds' options as "kinds.<kind>.<option>", an option group's as
        "<field>.<option>" (the field itself, None, where the group is off)."""
        out = self.to_dict()
        sections = out.pop("kinds")
        out.update({f"kinds.{k}.{n}": v for k, o in sections.items() for n, v in o.items()})
        for name, _ in _option_groups():
            if out[name] is not None:
                out.update({f"{name}.{n}": v for n, v in out.pop(name).items()})
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        """Builds a config from a mapping (e.g. an ml_collections ConfigDict, a model.json),
        naming unknown keys (with the closest field or kind option: an old model.json's flat
        kind field gdn_chunk is refused with 'did you mean kinds.gdn.chunk')."""
        known = [f.name for f in dataclasses.fields(cls)]
        values = dict(values)
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise unknown_keys("ModelConfig field(s)", unknown, known, Sections().flat_keys())
        kinds = {k: dict(o) for k, o in dict(values.pop("kinds", None) or {}).items()}
        return cls(**values, kinds=Sections(kinds))


def _option_groups() -> list[tuple[str, Any]]:
    """ModelConfig's option groups: (field, its options dataclass), from the fields' metadata."""
    return [
        (f.name, f.metadata["options"])
        for f in dataclasses.fields(ModelConfig)
        if "options" in f.metadata
    ]


def _index_in_stack(cycle: tuple[str, ...], c: Any, j: int) -> Any:
    """Index of cycle position j of cycle c in the stack of its entry's layers (c may be traced):
    c * (the entry's count in the cycle) + (its occurrences before j)."""
    return c * cycle.count(cycle[j]) + cycle[:j].count(cycle[j])
