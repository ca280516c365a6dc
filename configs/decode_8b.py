"""Fig. 4's 8B decode step at a 128K-token context as a program to compile (launch/compile.py):
configs/prefill_8b.py's model, one token per row against a full cache of 131,072 slots.

    python launch/compile.py --config=configs/decode_8b.py --target=v5e:2x2 --out=runs/aot/d128k
    python launch/compile.py --config=configs/decode_8b.py --target=v5p:2x2x1 --mesh.tensor=1 \
        --out=runs/aot/d128k_v5p

Sections as in prefill_8b.py; --config.inference.batch_size sets the rows decoded at once.

Argument after ':': "speculative" compiles self-speculative decoding's programs instead
(benchmarks/aot_spec.py: the decode step, the draft step, a verify pass per k in
inference.spec_ks) and projects bytes per accepted token at inference.acceptance, the tokens
per verify measured on the trained default job's model (docs/speculative.md: 4.33 at k = 4,
6.87 at k = 8, draft window = w); --config.model.architecture=transformer
--config.model.scale_offset=False gives the Transformer arm's MagicDec-style rounds.

    python launch/compile.py --config=configs/decode_8b.py:speculative --target=h100x1 \
        --mesh.tensor=1 --config.model.attention_impl=cudnn --out=runs/aot/spec_h100
Default mesh: tensor=4 (heads and kv heads over 4 chips), the smallest slice it fits, v5e:2x2
(11.7 GiB of 16 per chip); one v5p chip holds it whole (47 GiB).
"""

import importlib.util
import os

import ml_collections


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    if variant not in ("", "speculative"):
        raise ValueError(f"unknown variant {variant!r}; allowed: speculative")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prefill_8b.py")
    spec = importlib.util.spec_from_file_location("_prefill_8b", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.inference_config("decode", 131072, 1)
    c.mesh.tensor = 4
    if variant == "speculative":
        c.inference.mode = "speculative"
        c.inference.spec_ks = (4, 8)
        c.inference.acceptance = (4.33, 6.87)
        c.inference.draft_window = 0  # the model's window (w = 128)
    return c
