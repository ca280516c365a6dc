"""Fig. 4's 8B prefill as a program to compile (launch/compile.py): Llama-3.1-8B's shapes as
Orthros (window 128), bf16 weights and activations, one 128K-token prompt into an empty cache.

    python launch/compile.py --config=configs/prefill_8b.py --target=v5p:2x2x1 --out=runs/aot/p128k
    python launch/compile.py --config=configs/prefill_8b.py:1m --target=v5p:2x2x2 \
        --out=runs/aot/p1m

Argument after ':': "128k" (default: one chip) or "1m" (1,048,576 tokens, sequence parallel over
8 chips: mesh.sequence=8). Sections: model (ModelConfig), inference (benchmarks/aot.py's
InferenceConfig: mode, batch_size, prompt_len, max_len), mesh (data, sequence, tensor).
"""

import importlib.util
import os

import ml_collections

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import section

# length -> (prompt tokens, sequence-parallel chips)
LENGTHS = {"128k": (131072, 1), "1m": (1048576, 8)}


def llama31_8b() -> dict:
    """LLAMA31_8B of configs/convert_llama31_8b.py (configs are files, not a package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "convert_llama31_8b.py")
    spec = importlib.util.spec_from_file_location("_convert_llama31_8b", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.LLAMA31_8B)


def inference_config(mode: str, tokens: int, sequence: int) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = section(
        ModelConfig(
            **llama31_8b(),
            window=128,
            architecture="orthros",
            scale_offset=True,
            dtype="bfloat16",
            param_dtype="bfloat16",
            scan_layers=True,
            prefill_chunk=4096,
            attention_block_q=512,
            attention_block_k=1024,
            attention_impl="splash",
        )
    )
    c.inference = ml_collections.ConfigDict(
        {"mode": mode, "batch_size": 1, "prompt_len": tokens, "max_len": tokens}
    )
    c.mesh = ml_collections.ConfigDict({"data": 1, "sequence": sequence, "tensor": 1})
    return c


def get_config(length: str = "128k") -> ml_collections.ConfigDict:
    if length not in LENGTHS:
        raise ValueError(f"unknown length {length!r}; allowed: {', '.join(LENGTHS)}")
    return inference_config("prefill", *LENGTHS[length])
