"""Table 1's GLA baseline at 1.3B: fla's GLA 1.3B shapes (its GLAConfig defaults, the config of
the fla-hub gla-1.3B-100B checkpoints: hidden 2048, 24 layers, 4 heads, expand_k 0.5, expand_v 1,
hidden_ratio 4 -> SwiGLU 5632, 32000 vocab, untied; 1.37B parameters) with configs/pt_1p3b.py's
data, optimizer, budget and sharding (the paper's 100B tokens in 2M-token batches by default).

    python launch/train.py --config=configs/pt_1p3b_gla.py --workdir=gs://.../gla_1p3b \
        --config.data.corpus=/data/fineweb-edu/*.jsonl --config.data.tokenizer=/data/tokenizer.json

Argument after ':' as in pt_1p3b.py ("100b", the default, or "10b"). configs/pt_1p3b_retnet.py
and configs/pt_1p3b_gdn.py are the other two fla baselines, built the same way.
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file, section
from orthros_jax.convert.fla_config import config_from_fla

# fla's config.json of the 1.3B model (the options we compute; the rest are fla's defaults).
FLA_1P3B = {
    "gla": {
        "model_type": "gla",
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_heads": 4,
        "expand_k": 0.5,
        "expand_v": 1.0,
        "hidden_ratio": 4,
        "vocab_size": 32000,
    },
    "retnet": {
        "model_type": "retnet",
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_heads": 8,
        "expand_k": 1.0,
        "expand_v": 2.0,
        "hidden_ratio": 2,
        "vocab_size": 32000,
    },
    "gated_deltanet": {
        "model_type": "gated_deltanet",
        "hidden_size": 2048,
        "num_hidden_layers": 21,
        "num_heads": 6,
        "head_dim": 256,
        "expand_v": 2.0,
        "hidden_ratio": 4,
        "vocab_size": 32000,
    },
}


def fla_baseline(model_type: str, budget: str) -> ml_collections.ConfigDict:
    """pt_1p3b.py's recipe with the model replaced by fla's 1.3B model_type (training dtype,
    remat and scan as pt_1p3b.py's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, f"pt_1p3b.py:{budget or '100b'}"))
    keep = {k: c.model[k] for k in ("dtype", "param_dtype", "scan_layers", "remat")}
    c.model = section(config_from_fla(FLA_1P3B[model_type], **keep))
    return c


def get_config(budget: str = "100b") -> ml_collections.ConfigDict:
    return fla_baseline("gla", budget)
