"""Deprecated location: samplers live in `orthros_jax.inference.sampling` (kept so that
`from orthros_jax.sampling import Sampler` keeps working)."""

from orthros_jax.inference.sampling import (  # noqa: F401
    Sampler,
    filter_logits,
    greedy,
    sample,
    temperature,
    top_k,
    top_p,
)
