"""The cheap conversions of issue 36: experiment 3's Transformer -> Orthros continuation
(configs/lm_convert.py:orthros: byte-level, T=128, window 16 < T) training only part of the
model, at its steps and data.

    python launch/train.py --config=configs/convert_cheap.py:so \
        --config.init_from=runs/cv_orthros_init --workdir=runs/cv_so

Arms (the config argument):
  so      the scale-offset vectors only (train.trainable="scale_offset")
  lora8   LoRA r=8 (alpha 16) on every declared projection, plus the scale-offsets
  lora32  LoRA r=32 (alpha 64), plus the scale-offsets
  full    every parameter (lm_convert.py:orthros at its own best lr)
The frozen parameters get no optimizer state. Each arm runs at its best lr of the sweep
1e-3 .. 1e-1 in docs/results.md section 3b (benchmarks/cheap_conversion.py --lrs): the fewer
parameters train, the higher it is (SO only 1e-1, at the sweep's top edge).
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file, with_group

ARMS = {"so": None, "lora8": 8, "lora32": 32, "full": None}  # arm -> LoRA rank
LR = {"so": 1e-1, "lora8": 1e-2, "lora32": 1e-2, "full": 3e-3}  # each arm's best (section 3b)


def get_config(arm: str = "so") -> ml_collections.ConfigDict:
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; allowed: {', '.join(ARMS)}")
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, "lm_convert.py:orthros"))
    c.optimizer.lr = LR[arm]
    if arm == "full":
        return c
    c.optimizer.weight_decay = 0.0
    if arm == "so":
        c.train.trainable = "scale_offset"
        return c
    rank = ARMS[arm]
    c.model = with_group(c.model, "lora", dict(rank=rank, alpha=2.0 * rank, dropout=0.0))
    c.train.trainable = "lora"
    return c
