"""configs/convert_llama31_8b.py (the paper's Llama-3.1-8B -> Orthros conversion at 32K) training
LoRA adapters of rank 16 (alpha 32) on every attention and FFN projection plus the
scale-offsets; the base weights are frozen and hold no optimizer state (docs/lora.md).

    python launch/compile.py --out=runs/aot/conv_v5p8_lora16 \
        --config=configs/convert_llama31_8b_lora.py --target=v5p:2x2x2
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file, with_group


def get_config(init_from: str = "") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = f"convert_llama31_8b.py:{init_from}" if init_from else "convert_llama31_8b.py"
    c = load_config_file(os.path.join(here, spec))
    c.model = with_group(c.model, "lora", dict(rank=16, alpha=32.0, dropout=0.0))
    c.train.trainable = "lora"
    c.optimizer.weight_decay = 0.0
    return c
