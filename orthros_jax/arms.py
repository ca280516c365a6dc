"""The arms of the paper's experiments, in one table: what each is made of, how it attends, how
results name and draw it, and which experiments run it.

An arm is a model architecture (ModelConfig.architecture: its default cycle of layer kinds and
the streams) or a variant of one (`variant_of` with config `overrides`, e.g. Orthros without
scale-offsets). The evaluation report (labels, colours, order), launch/experiments.py and
launch/mqar.py (the arms they accept and run by default) and launch/convert.py read it; nothing
else lists arms. Kinds are named here as data (the cycles), by the names layers/registry.py
registers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The experiments of launch/experiments.py and launch/mqar.py (runs: the arms experiments.py
# accepts for recall / lm / convert; mqar takes any arm configs/mqar.py builds).
RECALL, LM, CONVERT, MQAR = "recall", "lm", "convert", "mqar"


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm.

    layer_types: the default cycle of kinds (a variant: its architecture's). two_streams: an
    Orthros output stream (per-stream query SO by default); base_window: the base stream's
    attention is the sliding window (else causal over every key); any_recurrent: a hybrid, whose
    recurrent layers may be of any recurrent kind (e.g. a (gla, attention) cycle). label /
    colour: its name in tables and its matplotlib colour. runs: the experiments it may run in;
    default_in: those that run it when no arms are named. two_stream_form: the two-stream arm
    convert.from_transformer makes of it (its weights plus an identity output stream)."""

    label: str
    colour: str
    layer_types: tuple[str, ...] = ()
    two_streams: bool = False
    base_window: bool = False
    any_recurrent: bool = False
    variant_of: str | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    runs: frozenset[str] = frozenset({RECALL})
    default_in: frozenset[str] = frozenset()
    two_stream_form: str | None = None

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(self.layer_types)


_ATTN = frozenset({RECALL, LM})
_CONV = frozenset({RECALL, LM, CONVERT})
# The hybrids use Qwen3.5's cycle of three GDN layers and one attention layer.
_HYBRID = ("gdn", "gdn", "gdn", "attention")
# Listed in the tables' order.
ARMS: dict[str, Arm] = {
    "transformer": Arm(
        "Transformer",
        "C0",
        ("attention",),
        runs=_CONV,
        default_in=frozenset({RECALL, LM, CONVERT, MQAR}),
        two_stream_form="orthros",
    ),
    "swa": Arm(
        "SWA",
        "C7",
        ("attention",),
        base_window=True,
        runs=_ATTN,
        default_in=frozenset({RECALL, LM, MQAR}),
    ),
    "orthros": Arm(
        "Orthros",
        "C3",
        ("attention",),
        two_streams=True,
        base_window=True,
        runs=_CONV,
        default_in=frozenset({RECALL, LM, CONVERT, MQAR}),
    ),
    "orthros_noso": Arm(
        "Orthros w/o SO",
        "C1",
        variant_of="orthros",
        overrides=(("scale_offset", False),),
        runs=_CONV,
        default_in=frozenset({RECALL, LM}),
    ),
    "gdn": Arm("GDN", "C2", ("gdn",)),
    "hybrid": Arm("Linear Hybrid", "C4", _HYBRID, any_recurrent=True, two_stream_form="orthros_h"),
    "orthros_h": Arm(
        "Orthros-H", "C5", _HYBRID, two_streams=True, base_window=True, any_recurrent=True
    ),
    # Table 1's other linear baselines (fla's GLA and RetNet), pure stacks.
    "gla": Arm("GLA", "C6", ("gla",), runs=_ATTN),
    "retnet": Arm("RetNet", "C8", ("retention",), runs=_ATTN),
    # Mamba-2's SSD (layers/mamba2.py), a pure stack.
    "mamba2": Arm("Mamba-2", "C9", ("mamba2",), runs=_ATTN),
}
# The model architectures: the arms that are not variants.
ARCHITECTURES: dict[str, Arm] = {n: a for n, a in ARMS.items() if a.variant_of is None}
for _name, _arm in ARMS.items():
    if _arm.variant_of is not None:  # a variant is its architecture's cycle and streams
        ARMS[_name] = dataclasses.replace(
            ARCHITECTURES[_arm.variant_of],
            **{
                f: getattr(_arm, f)
                for f in ("label", "colour", "variant_of", "overrides", "runs", "default_in")
            },
        )


def architecture_of(arm: str) -> str:
    """The ModelConfig.architecture of an arm."""
    return ARMS[arm].variant_of or arm


def arms_for(experiment: str, *, default: bool = False) -> tuple[str, ...]:
    """The arms an experiment may run (default=True: those it runs when none are named)."""
    return tuple(n for n, a in ARMS.items() if experiment in (a.default_in if default else a.runs))


# Single-stream architecture -> its two-stream conversion (transformer -> orthros, ...).
TWO_STREAM_FORM: dict[str, str] = {
    n: a.two_stream_form for n, a in ARCHITECTURES.items() if a.two_stream_form
}


def label(arm: str) -> str:
    return ARMS[arm].label if arm in ARMS else arm


def colour(arm: str) -> str | None:
    return ARMS[arm].colour if arm in ARMS else None
