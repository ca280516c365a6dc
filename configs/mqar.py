"""MQAR (Zoology-style multi-query associative recall), one arm per config, same training.

    python launch/mqar.py --out=runs/mqar                      # transformer, swa, orthros
    python launch/mqar.py --out=runs/mqar --arms=transformer,swa,orthros,gdn
    python launch/train.py-style overrides: --override=train.steps=300 (every arm)

The model, optimizer and arms are configs/lm_byte.py's (d=64, 2 layers, window 16), with the
vocabulary of the MQAR ids. Every arm trains on the same batches (data/mqar.py: rows of 256
tokens packing examples of one (length, pairs) shape from the grid below) for the same steps,
and is scored on held-out examples per (length, pairs) cell: query accuracy, teacher-forced
argmax at each query key (exact: one token per answer).

Sections: model / optimizer / train / mesh / distributed / init_from as in every training
config; data: MQARConfig fields; eval: the scoring grid (lengths x pairs, examples per cell,
distance bins in tokens).
"""

import os

import ml_collections

from orthros_jax.configlib import load_config_file, section
from orthros_jax.data.mqar import MQARConfig
from orthros_jax.evaluation.mqar_report import MQAREval


def get_config(arm: str = "orthros") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, f"lm_byte.py:{arm}"))  # same model, same arms
    c.data = section(MQARConfig(vocab_size=256, seq_len=256, batch_size=16))
    c.optimizer.lr = 3e-3
    c.optimizer.warmup_steps = 50
    c.train.steps = 1000
    c.train.eval_batches = 2
    c.eval = section(MQAREval(lengths=(64, 128), pairs=(4, 8, 16), examples=32))
    return c
