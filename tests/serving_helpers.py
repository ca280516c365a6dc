"""What the serving tests share: a tiny model of each arm, far from greedy ties."""

from __future__ import annotations

import jax
from helpers import tiny_config

from orthros_jax.config import ModelConfig
from orthros_jax.model import init_params

GDN = dict(
    kinds=dict(
        gdn=dict(num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=6, conv_kernel=3, chunk=4)
    ),
)


# GLA with its short conv (a conv window in the state), retention without (an empty one).
LINEAR = dict(
    kinds=dict(
        gla=dict(
            heads=4, kv_heads=2, k_head_dim=8, v_head_dim=6, short_conv=True, conv_kernel=3, chunk=4
        ),
        retention=dict(heads=4, kv_heads=2, k_head_dim=8, v_head_dim=6, chunk=4),
    ),
)


def arm_config(arch: str, **kw) -> ModelConfig:
    """A tiny model of the arm (init_std 0.2: peaked logits, so greedy ties are unlikely);
    GDN arms with one (gdn, attention) cycle, or one gdn layer; gla / retnet with 2 layers."""
    base = dict(architecture=arch, prefill_chunk=8, init_std=0.2, window=4)
    if arch in ("gdn", "hybrid", "orthros_h"):
        layers = ("gdn",) if arch == "gdn" else ("gdn", "attention")
        base |= GDN | dict(n_layers=2, layer_types=layers)
    elif arch in ("gla", "retnet"):
        base |= LINEAR | dict(n_layers=2)
    return tiny_config(**(base | kw))


def arm_model(arch: str, **kw):
    cfg = arm_config(arch, **kw)
    return cfg, jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))


# Requests of the every-arm greedy tests (engine and server share them, and so their compiles):
# lengths across 1-3 prefill chunks, 5 requests for 3 slots (rows reused), ragged new tokens.
PROMPT_LENS = (21, 3, 9, 1, 14)
NEW_TOKENS = (6, 9, 4, 7, 5)
ENGINE_SHAPE = dict(max_batch=3, max_len=40, chunk_budget=8, prefill_batches=(1, 3))
