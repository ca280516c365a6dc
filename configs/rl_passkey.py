"""GRPO on the passkey task, from a model SFT-warmed on it (configs/recall_passkey.py).

    python launch/train.py --config=configs/recall_passkey.py:orthros \
        --config.train.steps=150 --workdir=runs/rl_warm_orthros
    python launch/rl.py --config=configs/rl_passkey.py:runs/rl_warm_orthros \
        --workdir=runs/rl_orthros

The argument after ':' is the model directory or training workdir to start from (the policy
and the frozen reference); the model section is read from its model.json. Without it a
random recall_passkey-shaped Orthros model starts (reward ~0: a smoke test, not an
experiment). Each step: 8 prompts (a 2-digit key in 128 tokens of filler, asked at the end) x
8 samples of 2 tokens from the serving engine, reward 1 when the key is exact; one update on
the SFT-shaped batch (output copies only on the completions).
"""

import os

import ml_collections

from orthros_jax import checkpoint
from orthros_jax.config.cli import load_config_file, section
from orthros_jax.rl.config import GRPOConfig, RolloutConfig, TaskConfig
from orthros_jax.training import LoopConfig


def get_config(init_from: str = "") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    warm = load_config_file(os.path.join(here, "recall_passkey.py:orthros"))
    c = ml_collections.ConfigDict()
    c.model = warm.model
    if init_from:
        model_cfg, _ = checkpoint.read_model_json(init_from)
        c.model = section(model_cfg)
    c.init_from = init_from or None
    c.task = section(TaskConfig(name="passkey", context_len=128, digits=2, eval_prompts=64))
    c.rollout = section(
        RolloutConfig(
            prompts=8, group_size=8, max_new_tokens=2, temperature=1.0, max_batch=32, max_len=160
        )
    )
    c.grpo = section(GRPOConfig(rows=16, seq_len=512, out_len=8, kl_coef=0.0))
    c.optimizer = warm.optimizer
    c.optimizer.lr = 1e-4
    c.optimizer.warmup_steps = 0
    c.optimizer.weight_decay = 0.0
    c.train = section(
        LoopConfig(
            steps=40,
            seed=0,
            log_every=5,
            eval_every=20,
            checkpoint_every=10,
            keep_checkpoints=2,
            eval_batches=1,
        )
    )
    c.mesh = warm.mesh
    return c
