"""Benchmark config of the 'sequence' suite (launch/benchmark.py --suites=sequence): a small
model prefilled sequence-parallel over 8 devices, 64K -> 1M tokens.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python launch/benchmark.py \
        --config=configs/bench_sequence.py --suites=sequence --out=runs/bench_sequence

On a machine with 8 accelerators the same command runs on them (the flag only adds CPU devices).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # Small, with a Llama-like ratio of cache to activations per token (layers x 2 x kv heads x
    # head_dim = 8 x d_model), so the per-device memory is the cache shard's, as at scale.
    c.model = ml_collections.ConfigDict(
        dict(
            vocab_size=256,
            d_model=128,
            n_layers=4,
            n_heads=4,
            n_kv_heads=4,
            head_dim=32,
            d_ff=384,
            window=128,
            architecture="orthros",
            scale_offset=True,
            dtype="float32",  # launch/benchmark.py switches to bfloat16 on accelerators
            param_dtype="float32",
            # A 512-token chunk: at 64K a shard holds only 8K tokens, and a 2048-token chunk's
            # window-attention temporaries (23 MB) outweighed its cache (peak 1.66x vs 1.27x).
            prefill_chunk=512,
            attention_block_local=128,
            attention_block_q=512,
            attention_block_k=512,
        )
    )
    c.sequence_devices = 8  # the mesh's sequence axis
    c.sequence_lengths = (65536, 131072, 262144, 524288, 1048576)  # Orthros scaling, 2^16..2^20
    c.sequence_repeats = 2  # timed calls per length after the warm-up (a 1M call takes minutes)
    # Orthros vs the Transformer arm: lengths where the quadratic arm runs in a few minutes here.
    c.sequence_transformer_lengths = (8192, 16384, 32768)
    c.sequence_single_len = 131072  # sequence-parallel vs one device: same logits, overhead
    # Fields every suite of launch/benchmark.py reads.
    c.repeats = 3
    c.batch_size = 1
    c.seed = 0
    return c
