"""Fig. 4's 8B decode step at a 128K-token context as a program to compile (launch/compile.py):
configs/prefill_8b.py's model, one token per row against a full cache of 131,072 slots.

    python launch/compile.py --config=configs/decode_8b.py --target=v5p:2x2x1 --out=runs/aot/d128k

Sections as in prefill_8b.py; --config.inference.batch_size sets the rows decoded at once.
"""

import importlib.util
import os

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prefill_8b.py")
    spec = importlib.util.spec_from_file_location("_prefill_8b", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.inference_config("decode", 131072, 1)
