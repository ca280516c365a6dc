"""Table 1's RetNet baseline at 1.3B: fla's RetNet 1.3B shapes (its RetNetConfig defaults:
hidden 2048, 24 layers, 8 heads, expand_k 1, expand_v 2, hidden_ratio 2 -> SwiGLU 2816, 32000
vocab, untied; 1.35B parameters) with configs/pt_1p3b.py's data, optimizer, budget and sharding.

    python launch/train.py --config=configs/pt_1p3b_retnet.py --workdir=gs://.../retnet_1p3b \
        --config.data.corpus=/data/fineweb-edu/*.jsonl --config.data.tokenizer=/data/tokenizer.json

Argument after ':' as in pt_1p3b.py ("100b", the default, or "10b"). Built by
pt_1p3b_gla.py's fla_baseline.
"""

import importlib.util
import os

import ml_collections


def get_config(budget: str = "100b") -> ml_collections.ConfigDict:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pt_1p3b_gla.py")
    spec = importlib.util.spec_from_file_location("_pt_1p3b_gla", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fla_baseline("retnet", budget)
