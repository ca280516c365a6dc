"""The layer kinds by name. Adding a kind = its module in layers/ and one line in KINDS
(docs/adding_a_layer_kind.md); config validation and options sections, the cache, shardings,
FLOP and parameter counts, the weight-decay mask, export and scale-offset discovery all read
this table."""

from __future__ import annotations

from orthros_jax import config as config_lib
from orthros_jax.config import ModelConfig
from orthros_jax.layers import attend, attention, gdn, gla, mamba2, retention
from orthros_jax.layers.cudnn import cudnn_attention
from orthros_jax.layers.kind import LayerKind
from orthros_jax.layers.splash import splash

KINDS: dict[str, LayerKind] = {  # each module's KIND (a kind.Kind) is a LayerKind
    attention.KIND.name: attention.KIND,
    gdn.KIND.name: gdn.KIND,
    gla.KIND.name: gla.KIND,
    retention.KIND.name: retention.KIND,
    mamba2.KIND.name: mamba2.KIND,
}

# The accelerator implementations of attention (they import the seam, so they register here).
attend.register("splash", splash)
attend.register("cudnn", cudnn_attention)

for _kind in KINDS.values():
    config_lib.register_layer_kind(
        _kind.name, _kind.validate, recurrent=_kind.recurrent, options=_kind.options
    )


def kinds_of(cfg: ModelConfig) -> list[LayerKind]:
    """The kinds a config uses, in cycle order, each once."""
    return [KINDS[name] for name in dict.fromkeys(cfg.layer_types)]
