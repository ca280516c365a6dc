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


_ATTENTION = ("attention",)
# The hybrids use Qwen3.5's cycle of three GDN layers and one attention layer.
_HYBRID = ("gdn", "gdn", "gdn", "attention")

# In the order of results' tables.
ARCHITECTURES: Mapping[str, Architecture] = types.MappingProxyType(
    {
        "transformer": Architecture(_ATTENTION, two_stream_form="orthros"),
        "swa": Architecture(_ATTENTION, base_window=True),
        "orthros": Architecture(_ATTENTION, two_streams=True, base_window=True),
        "gdn": Architecture(("gdn",)),
        "hybrid": Architecture(_HYBRID, any_recurrent=True, two_stream_form="orthros_h"),
        "orthros_h": Architecture(_HYBRID, two_streams=True, base_window=True, any_recurrent=True),
        # Table 1's other linear baselines (fla's GLA and RetNet) and Mamba-2: pure stacks.
        "gla": Architecture(("gla",)),
        "retnet": Architecture(("retention",)),
        "mamba2": Architecture(("mamba2",)),
    }
)
# ModelConfig.architecture's default: the paper's model.
DEFAULT_ARCHITECTURE = "orthros"
# Single-stream architecture -> its two-stream conversion (transformer -> orthros, ...).
TWO_STREAM_FORM: Mapping[str, str] = types.MappingProxyType(
    {n: a.two_stream_form for n, a in ARCHITECTURES.items() if a.two_stream_form}
)
TWO_STREAM_ARCHITECTURES: tuple[str, ...] = tuple(
    n for n, a in ARCHITECTURES.items() if a.two_streams
)
