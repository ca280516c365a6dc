"""Configuration: frozen, typed values, checked on construction; importing it changes nothing.

Read top to bottom:
    options.py        the one-line ValueError checks; the base of a kind's options section
    architectures.py  the model architectures (default cycle of layer kinds, streams, window)
    kinds.py          each kind's options (cfg.kinds.gdn.chunk) and their Sections mapping
    moe.py            the mixture-of-experts FFN's options (ModelConfig.moe)
    model.py          ModelConfig itself
    arms.py           the experiments' arms: an architecture or a variant of one (presets)
    cli.py            ml_collections at the launchers' boundary (config files, --config.x=)

A config is checked against the layer registry (the kinds and FFN choices it names exist and
fit, each kind's own checks) by layers/registry.validate where a model is built.
"""

from orthros_jax.config.architectures import ARCHITECTURES, TWO_STREAM_ARCHITECTURES, Architecture
from orthros_jax.config.kinds import Sections
from orthros_jax.config.model import RUNTIME_FIELDS, ModelConfig
from orthros_jax.config.moe import MoEOptions
from orthros_jax.config.options import Options, option

__all__ = [
    "ARCHITECTURES",
    "RUNTIME_FIELDS",
    "TWO_STREAM_ARCHITECTURES",
    "Architecture",
    "ModelConfig",
    "MoEOptions",
    "Options",
    "Sections",
    "option",
]
