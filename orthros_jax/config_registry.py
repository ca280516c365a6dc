"""What the package registers for ModelConfig to check against: the arms, the layer kinds (with
their checks and options sections), the FFN choices and the attention implementations.

Filled on import of the package by orthros_jax.layers (registry.py, ffn.py, attend.py), so a
config built anywhere sees them; config.py itself names no kind, arm or FFN choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from orthros_jax import arms as arms_lib
from orthros_jax.arms import ARCHITECTURES as ARMS
from orthros_jax.arms import Arm
from orthros_jax.options import Options, register_options

# A kind's or the MoE's check of a ModelConfig (typed Any: config.py imports this module).
ConfigCheck = Callable[[Any], None]

# Filled by register_arms (layers/registry.py, on import of the package), like the kinds.
ARCHITECTURES: list[str] = []
TWO_STREAM_ARCHITECTURES: list[str] = []
DEFAULT_LAYER_TYPES: dict[str, tuple[str, ...]] = {}


@dataclasses.dataclass(frozen=True)
class KindEntry:
    """What the config knows of a registered layer kind: its checks of a config that uses it,
    whether it is recurrent (a hybrid's recurrent layers may be of any recurrent kind) and its
    options section (None: it has none)."""

    validate: ConfigCheck
    recurrent: bool
    options: type[Options] | None


# The layer kinds and the attention implementations, registered by orthros_jax.layers (its
# registry and attend modules; the package's __init__ imports them, so they are always here):
# ModelConfig checks layer_types and attention_impl against them, builds each kind's options
# section and runs each used kind's own checks. config.py itself names no kind.
LAYER_KINDS: dict[str, KindEntry] = {}
ATTENTION_IMPLS: list[str] = []
# Checks of a config with MoE layers that need the layer kinds (layers/registry.py adds its
# _check_moe_kinds).
MOE_CHECKS: list[ConfigCheck] = []
# The FFN choices a config's moe.ffn_cycle may name: layers/ffn.FFNS' names, and those of them
# that are routed mixtures of experts (what MoEOptions configures; register_ffns).
FFN_CHOICES: list[str] = []
ROUTED_FFNS: list[str] = []


def register_arms(table: dict[str, Arm]) -> None:
    """Makes the arms of `table` (orthros_jax/arms.py's rows) valid architectures."""
    arms_lib.register(table)
    ARCHITECTURES[:] = list(ARMS)
    TWO_STREAM_ARCHITECTURES[:] = [a for a, arm in ARMS.items() if arm.two_streams]
    DEFAULT_LAYER_TYPES.clear()
    DEFAULT_LAYER_TYPES.update({a: arm.layer_types for a, arm in ARMS.items()})


def register_layer_kind(
    name: str,
    validate: ConfigCheck,
    *,
    recurrent: bool,
    options: type[Options] | None = None,
) -> None:
    """Makes `name` a valid entry of layer_types; validate(cfg) raises ValueError for a config
    using the kind that does not fit; options: its section of ModelConfig.kinds."""
    if options is not None:
        if options.kind != name:
            raise ValueError(f"the options of kind {name!r} name kind {options.kind!r}")
        register_options(options)
    LAYER_KINDS[name] = KindEntry(validate, recurrent, options)


def register_ffns(routed: dict[str, bool]) -> None:
    """Makes the names of `routed` (layers/ffn.FFNS: name -> is it a routed MoE) the FFN
    choices a config's ffn_cycle may name."""
    FFN_CHOICES[:] = list(routed)
    ROUTED_FFNS[:] = [name for name, r in routed.items() if r]


def register_attention_impl(name: str) -> None:
    """Makes `name` a valid attention_impl."""
    if name not in ATTENTION_IMPLS:
        ATTENTION_IMPLS.append(name)
