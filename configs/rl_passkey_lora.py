"""GRPO on the passkey task training LoRA adapters (rank 8) and the scale-offsets only
(configs/rl_passkey.py otherwise). Each step the rollout engine receives the policy with the
adapters merged into its weights (same shapes every step: no recompile); the frozen reference
is the starting model.

    python launch/rl.py --config=configs/rl_passkey_lora.py:runs/rl_warm_orthros \
        --workdir=runs/rl_lora
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file, with_group


def get_config(init_from: str = "") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = f"rl_passkey.py:{init_from}" if init_from else "rl_passkey.py"
    c = load_config_file(os.path.join(here, spec))
    c.model = with_group(c.model, "lora", dict(rank=8, alpha=16.0, dropout=0.0))
    c.train.trainable = "lora"
    c.optimizer.lr = 1e-3
    return c
