"""LoRA SFT of the tiny model (configs/tiny_sft.py's task and data): adapters of rank 8 on the
attention and FFN projections the kinds declare (docs/lora.md), plus the scale-offsets; the
base weights are frozen and hold no optimizer state.

    python launch/train.py --config=configs/tiny_pt.py --workdir=runs/tiny
    python launch/train.py --config=configs/tiny_sft_lora.py:runs/tiny --workdir=runs/tiny_lora
    python launch/convert.py --export --model=runs/tiny_lora --out=runs/tiny_lora_hf  # merged

The argument after ':' (optional) is the model to start from (new adapters start at B = 0, so
the first step computes the base model).
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file, with_group


def get_config(init_from: str = "") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(
        os.path.join(here, f"tiny_sft.py:{init_from}" if init_from else "tiny_sft.py")
    )
    c.model = with_group(
        c.model, "lora", dict(rank=8, alpha=16.0, dropout=0.0, targets=("wq", "wk", "wv", "wo"))
    )
    c.train.trainable = "lora"
    c.optimizer.lr = 3e-3
    c.optimizer.weight_decay = 0.0
    return c
