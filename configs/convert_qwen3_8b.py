"""The paper's conversion recipe (App. A, Table 6) for Qwen3-8B -> Orthros.

    python launch/convert.py --hf_dir=/models/Qwen3-8B --out=runs/qwen3_8b_orthros \
        --window=128 --param_dtype=float32
    python launch/train.py --config=configs/convert_qwen3_8b.py:runs/qwen3_8b_orthros \
        --config.data.corpus=/data/cpt/*.jsonl --workdir=runs/qwen3_8b_cpt

Same recipe as configs/convert_llama31_8b.py (lr 3e-5, 10,000 steps, 500 warmup, min-lr
ratio 0.1, wd 0.1, T = 32768, 8M-token batches, activation checkpointing, w = 128) around
Qwen3-8B's shapes: 36 layers, q/k RMSNorm, rope theta 1e6, vocab 151936, untied.
"""

import importlib.util
import os

import ml_collections

DEFAULT_INIT = "runs/qwen3_8b_orthros"

QWEN3_8B = dict(
    vocab_size=151936,
    d_model=4096,
    n_layers=36,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    d_ff=12288,
    rope_theta=1_000_000.0,
    rope_type="default",
    norm_eps=1e-6,
    qk_norm=True,
    tie_embeddings=False,
)


def _recipe():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "convert_llama31_8b.py")
    spec = importlib.util.spec_from_file_location("_convert_llama31_8b", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.conversion_config


def get_config(init_from: str = DEFAULT_INIT) -> ml_collections.ConfigDict:
    return _recipe()(QWEN3_8B, init_from or DEFAULT_INIT)
