"""Each layer kind's own options: its section of ModelConfig.kinds (cfg.kinds.gdn.chunk; in an
ml_collections config `config.model.kinds.gdn.chunk`, on the CLI
`--config.model.kinds.gdn.chunk=32`), and `Sections`, the mapping of every section.

A section is a frozen dataclass subclassing options.Options whose `kind` names the layer kind
(layers/<kind>.py declares `options=` the same class); constructing one checks each field and
then `validate()`, the checks across its fields. A new kind with options adds its class here and
to OPTIONS (docs/adding_a_layer_kind.md); the registry checks that the two agree.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

from orthros_jax.config.options import (
    Options,
    check_positive,
    check_positive_int,
    choice,
    option,
    unknown_keys,
)

# The layer kinds' names, spelled once: each kind (layers/<kind>.py) takes its name from here,
# and the architectures' cycles and the options sections below name kinds through them.
ATTENTION, GDN, GLA, RETENTION, MAMBA2 = "attention", "gdn", "gla", "retention", "mamba2"
# The FFN choices' names, spelled once: layers/ffn.FFNS takes its keys from here (and each
# FFN stacks its parameters under its name).
DENSE_FFN, MOE_FFN = "dense", "moe"

# The feature maps a linear-attention kind may put on q and k (layers/linear_mixer.FEATURE_MAP
# holds their functions; None: the identity).
FEATURE_MAPS: tuple[str | None, ...] = (None, "relu", "sigmoid", "silu", "swish")


@dataclasses.dataclass(frozen=True)
class LinearOptions(Options):
    """The options every linear-attention kind has (cfg.kinds.<kind>): heads, kv heads
    (repeated to the heads), key / value head dims, the feature map on q / k, the swish output
    gate, the norm's weight (fla's elementwise_affine) and the kernel's chunk."""

    heads: int = option(4, check_positive_int)
    kv_heads: int = option(4, check_positive_int)
    k_head_dim: int = option(16, check_positive_int)
    v_head_dim: int = option(32, check_positive_int)
    feature_map: str | None = option(None, choice(*FEATURE_MAPS))
    output_gate: bool = option(True)
    norm_affine: bool = option(True)
    chunk: int = option(64, check_positive_int, runtime=True)

    def validate(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(
                f"{self.where('heads')}={self.heads} must be a multiple of "
                f"kv_heads={self.kv_heads} (each kv head serves heads/kv consecutive heads)"
            )


@dataclasses.dataclass(frozen=True)
class GDNOptions(Options):
    """Gated DeltaNet layers (Qwen3.5's linear_* fields), cfg.kinds.gdn: key / value heads and
    their head dims, the causal conv kernel, and the chunk of the chunked delta rule."""

    kind: ClassVar[str] = GDN
    num_k_heads: int = option(2, check_positive_int)
    num_v_heads: int = option(4, check_positive_int)
    k_head_dim: int = option(32, check_positive_int)
    v_head_dim: int = option(32, check_positive_int)
    conv_kernel: int = option(4, check_positive_int)
    chunk: int = option(64, check_positive_int, runtime=True)

    def validate(self) -> None:
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"{self.where('num_v_heads')}={self.num_v_heads} must be a multiple of "
                f"num_k_heads={self.num_k_heads} (each key head serves Hv/Hk consecutive value "
                "heads)"
            )


@dataclasses.dataclass(frozen=True)
class GLAOptions(LinearOptions):
    """cfg.kinds.gla: the shared linear-attention options (fla: hidden * expand_k / heads key
    dims, hidden * expand_v / heads value dims), the low-rank decay gate (rank, logit
    normalizer, optional clamp_min) and the optional short conv on q/k/v."""

    kind: ClassVar[str] = GLA
    gate_rank: int = option(16, check_positive_int)
    gate_normalizer: float = option(16.0, check_positive)
    clamp_min: float | None = option(None)
    short_conv: bool = option(False)
    conv_kernel: int = option(4, check_positive_int)

    def validate(self) -> None:
        super().validate()
        if self.clamp_min is not None and not -float("inf") < self.clamp_min <= 0:
            raise ValueError(
                f"{self.where('clamp_min')}={self.clamp_min!r} must be None or a finite log "
                "decay <= 0"
            )


@dataclasses.dataclass(frozen=True)
class RetentionOptions(LinearOptions):
    """cfg.kinds.retention: the shared linear-attention options (no decay gate, no conv; fla's
    RetNet defaults of 8 heads). Rotary rotates pairs: an even key head dim."""

    kind: ClassVar[str] = RETENTION
    heads: int = option(8, check_positive_int)
    kv_heads: int = option(8, check_positive_int)

    def validate(self) -> None:
        super().validate()
        if self.k_head_dim % 2:
            raise ValueError(
                f"{self.where('k_head_dim')}={self.k_head_dim} must be even (rotary pairs)"
            )


@dataclasses.dataclass(frozen=True)
class Mamba2Options(Options):
    """cfg.kinds.mamba2 (transformers' Mamba2Config names in brackets).

    heads [num_heads], head_dim [head_dim] (heads * head_dim = HF's expand * hidden_size),
    state [state_size], groups [n_groups] (B and C per group; divides heads), conv_kernel
    [conv_kernel], chunk (the kernel's chunk; [chunk_size] changes nothing computed),
    use_bias [use_bias: in_proj and out_proj], conv_bias [use_conv_bias], ffn (the shared
    block's SwiGLU FFN; False for a transformers Mamba2: its blocks have none), dt_limit
    [time_step_limit], dt_min / dt_max / dt_floor [time_step_min / max / floor]: dt_bias init.
    """

    kind: ClassVar[str] = MAMBA2
    heads: int = option(4, check_positive_int)
    head_dim: int = option(32, check_positive_int)
    state: int = option(16, check_positive_int)
    groups: int = option(1, check_positive_int)
    conv_kernel: int = option(4, check_positive_int)
    chunk: int = option(64, check_positive_int, runtime=True)
    use_bias: bool = option(False)
    conv_bias: bool = option(True)
    ffn: bool = option(True)
    dt_limit: tuple[float, float] = option((0.0, math.inf))
    dt_min: float = option(0.001, check_positive, runtime=True)
    dt_max: float = option(0.1, check_positive, runtime=True)
    dt_floor: float = option(1e-4, check_positive, runtime=True)

    def __post_init__(self) -> None:
        # model.json and ml_collections give the limit back as a list
        object.__setattr__(self, "dt_limit", tuple(float(x) for x in self.dt_limit))
        super().__post_init__()

    def validate(self) -> None:
        if self.heads % self.groups:
            raise ValueError(
                f"{self.where('heads')}={self.heads} must be a multiple of groups={self.groups} "
                "(each group's B and C serve heads/groups consecutive heads)"
            )
        if len(self.dt_limit) != 2 or not 0.0 <= self.dt_limit[0] < self.dt_limit[1]:
            raise ValueError(
                f"{self.where('dt_limit')}={self.dt_limit!r} must be (min, max) with 0 <= min < max"
            )
        if self.dt_min > self.dt_max:
            raise ValueError(
                f"{self.where('dt_min')}={self.dt_min} must be <= dt_max={self.dt_max}"
            )

    @property
    def per_group(self) -> int:
        return self.heads // self.groups


# Every kind's section, by kind name, in the order ModelConfig.kinds lists them.
OPTIONS: Mapping[str, type[Options]] = types.MappingProxyType(
    {cls.kind: cls for cls in (GDNOptions, GLAOptions, RetentionOptions, Mamba2Options)}
)


class Sections(Mapping[str, Options]):
    """Every kind's Options (ModelConfig.kinds), by kind name and as attributes (cfg.kinds.gdn);
    hashable, so a config stays a static jit argument. Built from a mapping of kind -> Options
    or -> a dict of options (the defaults fill the rest; every kind without an entry gets its
    defaults)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        values = dict(values or {})
        unknown = sorted(set(values) - set(OPTIONS))
        if unknown:
            raise unknown_keys("layer kind(s) in ModelConfig.kinds", unknown, list(OPTIONS))
        items = {}
        for kind, cls in OPTIONS.items():
            v = values.get(kind, {})
            items[kind] = v if isinstance(v, cls) else cls.from_dict(dict(v))
        self._items: dict[str, Options] = items

    def __getitem__(self, kind: str) -> Options:
        return self._items[kind]

    def __getattr__(self, kind: str) -> Any:
        items = self.__dict__.get("_items", {})
        if kind in items:
            return items[kind]
        raise AttributeError(f"ModelConfig.kinds has no kind {kind!r}; there are: {list(items)}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sections) and self._items == other._items

    def __repr__(self) -> str:
        return f"Sections({self._items!r})"

    def merged(self, changes: Mapping[str, Any]) -> Sections:
        """These sections with `changes` applied: kind -> Options replaces the section, kind ->
        dict changes only the options it names."""
        out: dict[str, Any] = dict(self._items)
        for kind, v in changes.items():
            if kind in out and not isinstance(v, Options):
                v = out[kind].to_dict() | dict(v)
            out[kind] = v
        return Sections(out)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {kind: o.to_dict() for kind, o in self._items.items()}

    def flat_keys(self) -> list[str]:
        """Every option as "kinds.<kind>.<option>" (the spelling of ModelConfig.flat)."""
        return [f"kinds.{k}.{n}" for k, o in self._items.items() for n in o.to_dict()]
