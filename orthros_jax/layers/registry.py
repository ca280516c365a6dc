"""The layer kinds by name, and `validate`, the one check of a ModelConfig against them.

Adding a kind = its module in layers/ and one line in KINDS (plus its options section in
config/kinds.py, and a row of config/architectures.py for a pure stack of it;
docs/adding_a_layer_kind.md). Config validation, the cache, shardings, FLOP and parameter
counts, the weight-decay mask, export and scale-offset discovery all read this table.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping

from orthros_jax.config import ModelConfig
from orthros_jax.config.kinds import OPTIONS
from orthros_jax.config.options import check_choice
from orthros_jax.layers import attention, attention_impls, ffn, gdn, gla, mamba2, retention
from orthros_jax.layers.attend import AttentionImpl
from orthros_jax.layers.kind import LayerKind

KINDS: Mapping[str, LayerKind] = types.MappingProxyType(
    {  # each module's KIND (a kind.Kind) is a LayerKind
        attention.KIND.name: attention.KIND,
        gdn.KIND.name: gdn.KIND,
        gla.KIND.name: gla.KIND,
        retention.KIND.name: retention.KIND,
        mamba2.KIND.name: mamba2.KIND,
    }
)
# Every attention implementation a config may name (ModelConfig.attention_impl).
ATTENTION_IMPLS: Mapping[str, AttentionImpl] = attention_impls.IMPLEMENTATIONS


def validate(cfg: ModelConfig) -> None:
    """Checks `cfg` against the registry: its layer kinds and FFN choices exist, its cycle fits
    its architecture, each kind it uses accepts it (and its MoE FFN), its attention
    implementation exists. A one-line ValueError naming the field; run (once per config) by
    kinds_of, which everything that builds or runs a model calls before any compile."""
    unknown = [k for k in cfg.layer_types if k not in KINDS]
    if unknown:
        raise ValueError(
            f"ModelConfig.layer_types={cfg.layer_types!r}: a non-empty cycle of kinds from "
            f"{', '.join(KINDS)}"
        )
    _check_cycle_fits_architecture(cfg)
    check_choice("ModelConfig.attention_impl", cfg.attention_impl, ATTENTION_IMPLS)
    if cfg.moe is not None:
        _check_moe(cfg)
    for kind in dict.fromkeys(cfg.layer_types):
        KINDS[kind].validate(cfg)
    if cfg.lora is not None:
        _check_lora_targets(cfg)


def _check_lora_targets(cfg: ModelConfig) -> None:
    """Every target of cfg.lora is a projection a kind of cfg declares adaptable
    (kind.ParamDecl.adapter_in > 0)."""
    assert cfg.lora is not None
    kinds = [KINDS[k] for k in dict.fromkeys(cfg.layer_types)]
    declared = {n for k in kinds for n, d in k.params(cfg).items() if d.adapter_in > 0}
    unknown = [t for t in cfg.lora.targets if t not in declared]
    if unknown or not declared:
        raise ValueError(
            f"ModelConfig.lora.targets: unknown target(s) {unknown}; the layers of "
            f"layer_types={cfg.layer_types!r} declare adaptable: {sorted(declared)}"
        )


def _check_cycle_fits_architecture(cfg: ModelConfig) -> None:
    """Every cycle of an architecture uses exactly its kinds; a hybrid's recurrent layers may
    be of any recurrent kind (KINDS[...].recurrent), beside its others."""
    arch, kinds = cfg.arch, set(cfg.layer_types)
    recurrent = {k for k, kind in KINDS.items() if kind.recurrent}
    fixed = arch.kinds - recurrent  # the architecture's non-recurrent kinds (a hybrid's attention)
    if arch.any_recurrent and fixed <= kinds and kinds - fixed and kinds - fixed <= recurrent:
        return
    if kinds != arch.kinds:
        if arch.any_recurrent:
            needs = f"needs {sorted(fixed)} layers and recurrent ones (any of {sorted(recurrent)})"
        elif len(arch.kinds) == 1:
            needs = f"needs only {next(iter(arch.kinds))!r} layers"
        else:
            needs = f"needs exactly the kinds {sorted(arch.kinds)}"
        raise ValueError(
            f"ModelConfig.layer_types={cfg.layer_types!r} does not fit architecture "
            f"{cfg.architecture!r}, which {needs} (e.g. {arch.layer_types!r}, the default)"
        )


def _check_moe(cfg: ModelConfig) -> None:
    """The checks of a MoE config that need the FFN choices and the kinds: its ffn_cycle names
    FFN choices (layers/ffn.FFNS), a routed one among them; each kind ends its block in an FFN
    for the MoE to replace (its parameters have the FFN's pre-norm mlp_norm; e.g. not
    kinds.mamba2.ffn=False); and paired routing runs the base stream's last prompt token again
    in prefill's read pass, beside its copy, which every kind must support
    (reads_last_token)."""
    assert cfg.moe is not None
    cycle, routed = cfg.moe.ffn_cycle, [n for n, f in ffn.FFNS.items() if f.routed]
    if any(f not in ffn.FFNS for f in cycle):
        raise ValueError(
            f"ModelConfig.moe.ffn_cycle={cycle!r}: a non-empty cycle of {', '.join(ffn.FFNS)}"
        )
    if not set(cycle) & set(routed):
        raise ValueError(
            f"ModelConfig.moe.ffn_cycle={cycle!r} has no routed layer ({', '.join(routed)}; set "
            "ModelConfig.moe=None for a dense model)"
        )
    kinds = [KINDS[k] for k in dict.fromkeys(cfg.layer_types)]
    bare = [k.name for k in kinds if "mlp_norm" not in k.params(cfg)]
    if bare:
        raise ValueError(
            f"ModelConfig.moe with layer_types={cfg.layer_types!r}: the {bare} layers have no "
            "FFN for the MoE FFN to replace"
        )
    alone = [k.name for k in kinds if not k.reads_last_token]
    if cfg.moe_routing == "paired" and alone:
        raise ValueError(
            f"ModelConfig.moe.routing='paired' with layer_types={cfg.layer_types!r}: paired "
            "routing runs the base stream's last prompt token again in prefill's read pass, "
            f"which the {alone} layers cannot; use routing='independent'"
        )


@functools.lru_cache(maxsize=256)
def _validated(cfg: ModelConfig) -> tuple[LayerKind, ...]:
    validate(cfg)
    return tuple(KINDS[name] for name in dict.fromkeys(cfg.layer_types))


def kinds_of(cfg: ModelConfig) -> list[LayerKind]:
    """The kinds a config uses, in cycle order, each once (the config validated first)."""
    return list(_validated(cfg))


def options_disagree() -> list[str]:
    """The kinds whose options section differs from config/kinds.OPTIONS' (empty: agree)."""
    declared = {k: kind.options for k, kind in KINDS.items() if kind.options is not None}
    return sorted({k for k, _ in set(declared.items()) ^ set(OPTIONS.items())})
