"""The model architectures (ModelConfig.architecture): what each is made of and how it attends.

Immutable data the config reads to fill its defaults (layer_types, scale_offset) and answer
two_streams / base_window; the layer kinds are named here as data, and the kind registry
(layers/registry.validate) checks that a config's cycle uses registered kinds that fit its
architecture. A variant of an architecture (Orthros without scale-offsets, the MoE arms) is an
arm: a preset of arms.py, not a row here.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

from orthros_jax.config.kinds import ATTENTION, GDN, GLA, MAMBA2, RETENTION


@dataclasses.dataclass(frozen=True)
class Architecture:
    """layer_types: the default cycle of layer kinds. two_streams: an Orthros output stream
    (per-stream query scale-offsets by default); base_window: the base stream's attention is
    the sliding window (else causal over every key); any_recurrent: a hybrid, whose recurrent
    layers may be of any recurrent kind (e.g. a (gla, attention) cycle); two_stream_form: the
    two-stream architecture convert.from_transformer makes of it (its weights plus an identity
    output stream)."""

    layer_types: tuple[str, ...]
    two_streams: bool = False
    base_window: bool = False
    any_recurrent: bool = False
    two_stream_form: str | None = None

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self.layer_types)


_ATTENTION = (ATTENTION,)
# The hybrids use Qwen3.5's cycle of three GDN layers and one attention layer.
_HYBRID = (GDN, GDN, GDN, ATTENTION)

# The architectures' names, spelled once (the arms' presets name their architecture by them).
TRANSFORMER, SWA, ORTHROS, ORTHROS_H = "transformer", "swa", "orthros", "orthros_h"
HYBRID, RETNET = "hybrid", "retnet"

# In the order of results' tables.
ARCHITECTURES: Mapping[str, Architecture] = types.MappingProxyType(
    {
        TRANSFORMER: Architecture(_ATTENTION, two_stream_form=ORTHROS),
        SWA: Architecture(_ATTENTION, base_window=True),
        ORTHROS: Architecture(_ATTENTION, two_streams=True, base_window=True),
        GDN: Architecture((GDN,)),
        HYBRID: Architecture(_HYBRID, any_recurrent=True, two_stream_form=ORTHROS_H),
        ORTHROS_H: Architecture(_HYBRID, two_streams=True, base_window=True, any_recurrent=True),
        # Table 1's other linear baselines (fla's GLA and RetNet) and Mamba-2: pure stacks.
        GLA: Architecture((GLA,)),
        RETNET: Architecture((RETENTION,)),
        MAMBA2: Architecture((MAMBA2,)),
    }
)
# ModelConfig.architecture's default: the paper's model.
DEFAULT_ARCHITECTURE = ORTHROS
# Single-stream architecture -> its two-stream conversion (transformer -> orthros, ...).
TWO_STREAM_FORM: Mapping[str, str] = types.MappingProxyType(
    {n: a.two_stream_form for n, a in ARCHITECTURES.items() if a.two_stream_form}
)
TWO_STREAM_ARCHITECTURES: tuple[str, ...] = tuple(
    n for n, a in ARCHITECTURES.items() if a.two_streams
)
