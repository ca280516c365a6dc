"""Table 1's Gated DeltaNet baseline at 1.3B: fla's GDN 1.3B shapes (its GatedDeltaNetConfig
defaults: hidden 2048, 21 layers, 6 heads of 256, expand_v 2 (value heads of 512), short conv 4,
hidden_ratio 4 -> SwiGLU 5632, 32000 vocab, untied; 1.39B parameters) with configs/pt_1p3b.py's
data, optimizer, budget and sharding; the gdn arm (our GDN kind = fla's GatedDeltaNet).

    python launch/train.py --config=configs/pt_1p3b_gdn.py --workdir=gs://.../gdn_1p3b \
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
    return module.fla_baseline("gated_deltanet", budget)
