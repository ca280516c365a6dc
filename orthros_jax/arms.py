"""The arms of the paper's experiments, in one table: what each is made of, how it attends, how
results name and draw it, and which experiments run it.

An arm is a model architecture (ModelConfig.architecture: its default cycle of layer kinds and
the streams) or a variant of one (`variant_of` with config `overrides`, e.g. Orthros without
scale-offsets). The evaluation report (labels, colours, order), launch/experiments.py and
launch/mqar.py (the arms they accept and run by default) and launch/convert.py read it; nothing
else lists arms. The rows are declared beside the kinds in layers/registry.py, whose kind names
they use, and registered with `register` when the package is imported (as the kinds are).
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


ATTN_RUNS = frozenset({RECALL, LM})  # the recall and byte-LM experiments
CONVERT_RUNS = frozenset({RECALL, LM, CONVERT})
# The table, in the order of results' tables: filled once by register() from the kind registry
# (layers/registry.py declares the arms with its kinds' own names).
ARMS: dict[str, Arm] = {}
# The model architectures: the arms that are not variants.
ARCHITECTURES: dict[str, Arm] = {}
# Single-stream architecture -> its two-stream conversion (transformer -> orthros, ...).
TWO_STREAM_FORM: dict[str, str] = {}


def register(table: dict[str, Arm]) -> None:
    """Fills ARMS, ARCHITECTURES and TWO_STREAM_FORM from `table` (a variant takes its
    architecture's cycle and streams)."""
    ARCHITECTURES.update({n: a for n, a in table.items() if a.variant_of is None})
    for name, arm in table.items():
        if arm.variant_of is not None:
            fields = ("label", "colour", "variant_of", "overrides", "runs", "default_in")
            arm = dataclasses.replace(
                ARCHITECTURES[arm.variant_of], **{f: getattr(arm, f) for f in fields}
            )
        ARMS[name] = arm
    TWO_STREAM_FORM.update(
        {n: a.two_stream_form for n, a in ARCHITECTURES.items() if a.two_stream_form}
    )


def architecture_of(arm: str) -> str:
    """The ModelConfig.architecture of an arm."""
    return ARMS[arm].variant_of or arm


def arms_for(experiment: str, *, default: bool = False) -> tuple[str, ...]:
    """The arms an experiment may run (default=True: those it runs when none are named)."""
    return tuple(n for n, a in ARMS.items() if experiment in (a.default_in if default else a.runs))


def label(arm: str) -> str:
    return ARMS[arm].label if arm in ARMS else arm


def colour(arm: str) -> str | None:
    return ARMS[arm].colour if arm in ARMS else None
