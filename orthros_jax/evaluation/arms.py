"""How the experiments treat each arm (config/arms.py's presets): its name in results' tables,
its matplotlib colour, the experiments that may run it and those that run it by default; and
how the recall and byte-LM experiments are scored (RECALL_EVAL, LM_EVAL). launch/experiments.py
and launch/mqar.py (the arms they accept and run by default), the experiment configs, the
evaluation report and benchmarks/cheap_conversion.py read it.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

from orthros_jax.config import arms as presets
from orthros_jax.config.architectures import HYBRID, ORTHROS, ORTHROS_H, RETNET, SWA, TRANSFORMER
from orthros_jax.config.kinds import GDN, GLA, MAMBA2
from orthros_jax.evaluation.suite import EvalSpec

# The experiments of launch/experiments.py and launch/mqar.py.
RECALL, LM, CONVERT, MQAR = "recall", "lm", "convert", "mqar"
ATTN_RUNS = frozenset({RECALL, LM})  # the recall and byte-LM experiments
CONVERT_RUNS = frozenset({RECALL, LM, CONVERT})
EVERYWHERE = frozenset({RECALL, LM, CONVERT, MQAR})

# How each experiment is scored (the training configs say how it is trained). Recall: passkey
# query accuracy at the training context (128 = 8 x window) and beyond it (192, 256).
RECALL_EVAL = EvalSpec(
    tasks=("passkey",),
    context_lengths=(128, 192, 256),
    depths=(0.0, 0.25, 0.5, 0.75, 1.0),
    samples=8,
    batch_size=40,
)
# The byte LM's held-out nats/byte: 16 batches of 16 rows of 128 bytes.
LM_EVAL = EvalSpec(tasks=("lm",), lm_seq_len=128, lm_batches=16, batch_size=16)


@dataclasses.dataclass(frozen=True)
class ArmEntry:
    """label / colour: the arm's name in tables and its matplotlib colour. runs: the
    experiments it may run in (mqar takes any arm configs/mqar.py builds); default_in: those
    that run it when no arms are named."""

    label: str
    colour: str
    runs: frozenset[str] = frozenset({RECALL})
    default_in: frozenset[str] = frozenset()


# In the order of results' tables (config/arms.py's); a table, one arm a row.
ARMS: Mapping[str, ArmEntry] = types.MappingProxyType(
    {
        TRANSFORMER: ArmEntry("Transformer", "C0", CONVERT_RUNS, EVERYWHERE),
        SWA: ArmEntry("SWA", "C7", ATTN_RUNS, frozenset({RECALL, LM, MQAR})),
        ORTHROS: ArmEntry("Orthros", "C3", CONVERT_RUNS, EVERYWHERE),
        presets.ORTHROS_NOSO: ArmEntry(
            "Orthros w/o SO", "C1", CONVERT_RUNS, frozenset({RECALL, LM})
        ),
        presets.TRANSFORMER_MOE: ArmEntry("Transformer-MoE", "navy", ATTN_RUNS),
        presets.ORTHROS_MOE: ArmEntry("Orthros-MoE", "darkred", ATTN_RUNS),
        presets.ORTHROS_MOE_INDEPENDENT: ArmEntry("Orthros-MoE (indep.)", "lightcoral", ATTN_RUNS),
        GDN: ArmEntry("GDN", "C2"),
        HYBRID: ArmEntry("Linear Hybrid", "C4"),
        ORTHROS_H: ArmEntry("Orthros-H", "C5"),
        GLA: ArmEntry("GLA", "C6", ATTN_RUNS),
        RETNET: ArmEntry("RetNet", "C8", ATTN_RUNS),
        MAMBA2: ArmEntry("Mamba-2", "C9", ATTN_RUNS),
    }
)


def arms_for(experiment: str, *, default: bool = False) -> tuple[str, ...]:
    """The arms an experiment may run (default=True: those it runs when none are named)."""
    return tuple(n for n, a in ARMS.items() if experiment in (a.default_in if default else a.runs))


def label(arm: str) -> str:
    return ARMS[arm].label if arm in ARMS else arm


def colour(arm: str) -> str | None:
    return ARMS[arm].colour if arm in ARMS else None
