"""Inference: the cache pytree (cache.py), the cached drivers (drivers.py), the
sequence-parallel drivers (sequence_parallel.py), samplers (sampling.py) and the public,
host-validated jitted API (api.py), re-exported here:

    from orthros_jax.inference import init_cache, prefill, decode_step, generate
"""

from orthros_jax.inference.api import (
    GenerateOutput,
    KVCache,
    Sampler,
    decode_step,
    generate,
    init_cache,
    prefill,
    prompt_bucket,
)
from orthros_jax.inference.speculative import Speculative

__all__ = [
    "GenerateOutput",
    "KVCache",
    "Sampler",
    "Speculative",
    "decode_step",
    "generate",
    "init_cache",
    "prefill",
    "prompt_bucket",
]
