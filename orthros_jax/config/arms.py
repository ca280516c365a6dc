"""The arms of the paper's experiments as presets: an arm is an architecture
(architectures.ARCHITECTURES, run as it is) or a variant of one, that architecture with config
`overrides` (e.g. Orthros without scale-offsets, the MoE arms).

The configs of the experiments (configs/lm_byte.py, configs/mqar.py, ...) build each arm's
ModelConfig from its preset; evaluation/arms.py says how results name and draw each arm and
which experiments run it.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

from orthros_jax.config.architectures import HYBRID, ORTHROS, ORTHROS_H, RETNET, SWA, TRANSFORMER
from orthros_jax.config.kinds import GDN, GLA, MAMBA2
from orthros_jax.config.moe import INDEPENDENT, PAIRED

# The variants' names, spelled once (an architecture's arm has the architecture's name).
ORTHROS_NOSO = "orthros_noso"
TRANSFORMER_MOE, ORTHROS_MOE = "transformer_moe", "orthros_moe"
ORTHROS_MOE_INDEPENDENT = "orthros_moe_independent"


@dataclasses.dataclass(frozen=True)
class Arm:
    """architecture: its ModelConfig.architecture; overrides: (field, value) pairs of the
    ModelConfig that make the variant (none: the architecture itself)."""

    architecture: str
    overrides: tuple[tuple[str, Any], ...] = ()

    @property
    def is_variant(self) -> bool:
        return bool(self.overrides)

    def fields(self) -> dict[str, Any]:
        """The ModelConfig fields the preset sets: architecture and the overrides."""
        return {"architecture": self.architecture, **dict(self.overrides)}


def _variant(architecture: str, **overrides: Any) -> Arm:
    """The architecture with ModelConfig fields `overrides` (keyword arguments: field names)."""
    return Arm(architecture, tuple(overrides.items()))


def _moe(**changes: Any) -> Mapping[str, Any]:
    """The MoE arms' FFN (ModelConfig.moe, read-only): 8 experts, top-2, transformers'
    load-balancing loss at 0.01. d_expert is left to each experiment config, which sizes it at
    its dense width (moe.dense_equivalent_d_expert: the k active experts hold the dense FFN's
    parameters)."""
    return types.MappingProxyType(dict(n_experts=8, top_k=2, aux_loss_coef=0.01) | changes)


# Every arm, in the order of results' tables.
ARMS: Mapping[str, Arm] = types.MappingProxyType(
    {
        TRANSFORMER: Arm(TRANSFORMER),
        SWA: Arm(SWA),
        ORTHROS: Arm(ORTHROS),
        ORTHROS_NOSO: _variant(ORTHROS, scale_offset=False),
        # Mixture-of-experts variants (docs/moe.md): paired (the copies read their base
        # token's experts) and independent routing of the output copies.
        TRANSFORMER_MOE: _variant(TRANSFORMER, moe=_moe()),
        ORTHROS_MOE: _variant(ORTHROS, moe=_moe(routing=PAIRED)),
        ORTHROS_MOE_INDEPENDENT: _variant(ORTHROS, moe=_moe(routing=INDEPENDENT)),
        GDN: Arm(GDN),
        HYBRID: Arm(HYBRID),
        ORTHROS_H: Arm(ORTHROS_H),
        GLA: Arm(GLA),
        RETNET: Arm(RETNET),
        MAMBA2: Arm(MAMBA2),
    }
)


def architecture_of(arm: str) -> str:
    """The ModelConfig.architecture of an arm."""
    return ARMS[arm].architecture
