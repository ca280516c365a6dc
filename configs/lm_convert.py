"""Experiment 3: Transformer -> Orthros conversion vs continuing the Transformer (base CPT).

    python launch/train.py --config=configs/lm_convert.py:pretrain --workdir=runs/cv_pre
    python launch/convert.py ...  (or convert.from_transformer + checkpoint.save_model)
    python launch/train.py --config=configs/lm_convert.py:orthros \
        --config.init_from=runs/cv_orthros_init --workdir=runs/cv_orthros
    python launch/experiments.py --experiments=convert --out=runs/exp   # all of it

Stages (the config argument):
  pretrain      a Transformer, T=128, from scratch (configs/lm_byte.py's model and data)
  orthros       continue the converted model (identity scale-offsets, window 16 < T)
  orthros_noso  the same without scale-offsets
  transformer   continue the pretrained Transformer for the same steps (the paper's base CPT)
The continuation stages take init_from (set by the driver) and use a lower lr (the paper's
conversion lr is 10x below its pretraining lr), a short warmup and a different data seed
(the pretraining batches are not replayed in the same order).
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file

STAGES = ("pretrain", "orthros", "orthros_noso", "transformer")


def get_config(stage: str = "pretrain") -> ml_collections.ConfigDict:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; allowed: {', '.join(STAGES)}")
    arm = "transformer" if stage == "pretrain" else stage
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, f"lm_byte.py:{arm}"))
    c.train.eval_every = 0
    if stage == "pretrain":
        c.train.steps = 200
        return c
    c.train.steps = 100
    c.train.eval_every = 25  # the continuation curves in the results plot
    c.train.eval_batches = 16  # the driver's held-out set (16 x 16 rows): curve ends at the table
    c.optimizer.lr = 1e-3
    c.optimizer.warmup_steps = 10
    c.data.seed = 1
    return c
