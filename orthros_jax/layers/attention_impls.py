"""Every attention implementation a config may name (ModelConfig.attention_impl), and `attend`,
the call a layer step makes through the seam (layers/attend.py holds its types).

The table is fixed when this module is defined: splash and cudnn import the seam, so the table
sits above them rather than being filled in by whoever imports them.
"""

from __future__ import annotations

import types
from collections.abc import Mapping

import jax

from orthros_jax.config import ModelConfig
from orthros_jax.layers.attend import AttentionImpl, Keys, dot_product, xla
from orthros_jax.layers.cudnn import cudnn_attention
from orthros_jax.layers.splash import splash

IMPLEMENTATIONS: Mapping[str, AttentionImpl] = types.MappingProxyType(
    {"xla": xla, "dot_product": dot_product, "splash": splash, "cudnn": cudnn_attention}
)


def resolve(impl: AttentionImpl | str) -> AttentionImpl:
    """The implementation itself, or the one named `impl` (ValueError if none)."""
    if not isinstance(impl, str):
        return impl
    if impl not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation {impl!r} is unknown; allowed: {', '.join(IMPLEMENTATIONS)}"
        )
    return IMPLEMENTATIONS[impl]


def attend(
    impl: AttentionImpl | str,
    q: jax.Array,
    q_positions: jax.Array,
    q_segment_ids: jax.Array,
    keys: Keys,
    window: int | None,
    cfg: ModelConfig,
) -> jax.Array:
    """Attention of queries q [B, Lq, N, H] at (positions, segment ids) [B, Lq] over `keys`:
    a sliding window of `window` keys (itself included), or causal over every key if None.
    Returns [B, Lq, N, H] in q's dtype; scores and softmax in float32."""
    fn = resolve(impl)
    if keys.split and fn in IMPLEMENTATIONS.values():
        raise ValueError(
            "keys split over a mesh axis need sequence parallelism's implementation "
            f"(parallel/sequence.py), not {impl!r}"
        )
    return fn(q, q_positions, q_segment_ids, keys, window, cfg)
