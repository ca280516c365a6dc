"""flops.py's gated DeltaNet branches: one GDN layer counted by hand, a GDN stack's decode cost
independent of the context, and the Linear Hybrid between the all-GDN and all-attention arms."""

from __future__ import annotations

from helpers import tiny_config

from orthros_jax.layers import flops

# D 16, V 10, Hk 1, Hv 2, dk 4, dv 3, conv kernel 2, F 8: small enough to count by hand.
ONE_GDN = dict(
    architecture="gdn",
    n_layers=1,
    d_model=16,
    vocab_size=10,
    d_ff=8,
    kinds=dict(gdn=dict(num_k_heads=1, num_v_heads=2, k_head_dim=4, v_head_dim=3, conv_kernel=2)),
)


def test_one_gdn_layer_by_hand():
    cfg = tiny_config(**ONE_GDN)
    proj = 2 * 16 * (4 + 4 + 6 + 6 + 2 + 2)  # q, k (Hk dk), v, z (Hv dv), beta, a (Hv): 768
    conv = 2 * 2 * (4 + 4 + 6)  # depthwise taps over q, k, v: 56
    update = 2 * 2 * 4 * 3 + 2 * 2 * 4 * 3  # k^T S, then the rank-1 write: 96
    read = 2 * 2 * 4 * 3  # q^T S: 48
    out = 2 * 6 * 16 + 2 * 3 * 16 * 8  # out_proj, SwiGLU: 960
    head = 2 * 16 * 10
    per_token = proj + conv + update + read + out
    assert flops.decode_flops(cfg, 7) == per_token + head == 2248
    assert flops.pt_forward_flops(cfg, 5) == 5 * (per_token + head)
    # Prefill: every token carries the state; only the last one is read (q, z, read, out, FFN).
    reads = 2 * 16 * 4 + 2 * 2 * 4 + 2 * 16 * 6 + read + out
    assert flops.prefill_flops(cfg, 5) == 5 * per_token - 4 * reads + head


def test_gdn_decode_is_independent_of_context():
    gdn = tiny_config(architecture="gdn", n_layers=4)
    assert flops.decode_flops(gdn, 100_000) == flops.decode_flops(gdn, 10)
    # Orthros-H (3 GDN layers, then attention): only the output copy's global read grows.
    cfg = tiny_config(architecture="orthros_h", n_layers=4)
    grow = flops.decode_flops(cfg, 1010) - flops.decode_flops(cfg, 10)
    assert grow == 4 * cfg.n_heads * cfg.head_dim * 1000


def test_hybrid_lies_between_gdn_and_transformer():
    """At 8K tokens, with the hybrid's attention layer first: prefill reads only the last
    position of the last layer, so an attention layer there would cost almost nothing."""
    t = 8192
    arms = {
        "gdn": tiny_config(architecture="gdn", n_layers=4),
        "hybrid": tiny_config(
            architecture="hybrid", n_layers=4, layer_types=("attention", "gdn", "gdn", "gdn")
        ),
        "transformer": tiny_config(architecture="transformer", n_layers=4),
    }
    for count in (flops.prefill_flops, flops.decode_flops, flops.pt_forward_flops):
        got = {a: count(cfg, t) for a, cfg in arms.items()}
        assert got["gdn"] < got["hybrid"] < got["transformer"], (count.__name__, got)
