"""The analytic FLOP counts of a mixture-of-experts model count each layer's FFN choice (router,
top-k experts, shared expert), hand-counted for a two-layer Orthros: a dense FFN layer, then a
MoE one."""

from __future__ import annotations

from orthros_jax.config import ModelConfig
from orthros_jax.layers import flops
from orthros_jax.training.monitor import train_step_flops

MOE = dict(n_experts=4, top_k=2, d_expert=8, shared_expert=4, ffn_cycle=("dense", "moe"))
# d 16, 2 query heads and 1 K/V head of 8, d_ff 32, vocab 50, window 4.
DIMS = dict(
    d_model=16, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32, vocab_size=50, window=4, n_layers=2
)
Q = KV = OUT = 2 * 16 * 16  # q: 2 d (n h); k and v: 2 * 2 d (k h); o: 2 (n h) d
PAIR = 4 * 2 * 8  # QK^T and PV per (query, key)
DENSE = 2 * 3 * 16 * 32
ROUTER, EXPERTS = 2 * 16 * 4, 2 * 2 * 3 * 16 * 8  # router D -> E; top-2 SwiGLUs of width 8
SHARED = 2 * 3 * 16 * 4 + 2 * 16  # the shared SwiGLU of width 4 and its sigmoid gate D -> 1
MOE_FFN = ROUTER + EXPERTS + SHARED
HEAD = 2 * 16 * 50


def _cfg(moe=MOE) -> ModelConfig:
    return ModelConfig(architecture="orthros", moe=moe, **DIMS)


def test_decode_counts_the_moe_layers_router_experts_and_shared_expert():
    # context 10: layer 0's base output reads its window of 4 keys, each copy all 10; the last
    # layer runs its copy only (its base output is never read).
    layer0 = KV + (Q + OUT + DENSE + 4 * PAIR) + (Q + OUT + DENSE + 10 * PAIR)
    layer1 = KV + (Q + OUT + MOE_FFN + 10 * PAIR)
    assert flops.decode_flops(_cfg(), 10) == HEAD + layer0 + layer1
    assert flops.decode_flops(_cfg(None), 10) == HEAD + layer0 + layer1 - MOE_FFN + DENSE


def test_pt_step_counts_the_moe_layers_ffn_for_every_copy():
    t = 8
    window_keys, causal_keys = 1 + 2 + 3 + 4 * 5, t * (t + 1) // 2
    layer0 = t * KV + t * (Q + OUT + DENSE) + PAIR * window_keys + t * (Q + OUT + DENSE)
    layer0 += PAIR * causal_keys
    layer1 = t * KV + t * (Q + OUT + MOE_FFN) + PAIR * causal_keys
    forward = t * HEAD + layer0 + layer1
    assert flops.pt_forward_flops(_cfg(), t) == forward
    assert train_step_flops(_cfg(), 2, t, t) == 3 * 2 * forward  # the metrics' MFU count
    assert flops.pt_forward_flops(_cfg(None), t) == forward + t * (DENSE - MOE_FFN)


def test_prefill_and_floor_count_the_moe_layer():
    t = 8
    diff = DENSE - MOE_FFN
    # The MoE layer (the last) runs one output copy in a two-stream prefill: one token's FFN.
    assert flops.prefill_flops(_cfg(None), t) - flops.prefill_flops(_cfg(), t) == diff
    # The floor runs the last layer's FFN for one token too.
    assert flops.floor_prefill_flops(_cfg(None), t) - flops.floor_prefill_flops(_cfg(), t) == diff
    # A MoE first layer: every prompt token's base output and the last token's copy.
    first = _cfg(MOE | dict(ffn_cycle=("moe", "dense")))
    assert flops.prefill_flops(_cfg(None), t) - flops.prefill_flops(first, t) == (t + 1) * diff
