"""Table 1's sliding-window baseline: configs/pt_1p3b.py with one stream attending a window of
512 keys (SWA, w = 512) and no query scale-offset; data, optimizer and budget unchanged.

    python launch/train.py --config=configs/pt_1p3b_swa.py --workdir=gs://.../swa_1p3b \
        --config.data.corpus=/data/fineweb-edu/*.jsonl --config.data.tokenizer=/data/tokenizer.json

Argument after ':' as in pt_1p3b.py ("100b", the default and Table 1's budget, or "10b").
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file


def get_config(budget: str = "100b") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, f"pt_1p3b.py:{budget or '100b'}"))
    c.model.architecture = "swa"
    c.model.window = 512
    c.model.scale_offset = False
    return c
