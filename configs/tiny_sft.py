"""SFT of the tiny model on the docstring task: prompt = a function's `def` line(s), answer =
the first line of its docstring (orthros_jax/data/sft.py). Output copies, and the loss, exist
only at the answer-predicting positions; the prompt only builds the base stream's memory.

    python launch/train.py --config=configs/tiny_pt.py --workdir=runs/tiny
    python launch/train.py --config=configs/tiny_sft.py:runs/tiny --workdir=runs/tiny_sft

The argument after ':' (optional) is the model directory or training workdir to start from
(init_from); the model section is then read from its model.json so the shapes match. Without
it the tiny_pt model trains from scratch.
"""

import os

import ml_collections

from orthros_jax import checkpoint
from orthros_jax.config.cli import load_config_file, section
from orthros_jax.data import DataConfig


def get_config(init_from: str = "") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, "tiny_pt.py"))
    if init_from:
        model_cfg, _ = checkpoint.read_model_json(init_from)
        c.model = section(model_cfg)
        c.init_from = init_from
    c.data = section(
        DataConfig(
            kind="sft",
            sft_task="docstring",
            corpus=("embedded",),
            tokenizer=None,
            seq_len=256,  # prompt + answer (longer examples are skipped)
            out_len=64,  # output copies per row (answers packed first-fit, padded)
            batch_size=16,
            validation_fraction=0.05,
            seed=0,
        )
    )
    c.optimizer.lr = 1e-3
    c.optimizer.warmup_steps = 20
    c.train.steps = 200
    c.train.eval_every = 50
    c.train.checkpoint_every = 50
    return c
