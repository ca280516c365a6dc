"""Benchmark config (launch/benchmark.py): the model of issue 6 and the sizes of its suites."""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = ml_collections.ConfigDict(
        dict(
            vocab_size=256,
            d_model=512,
            n_layers=4,
            n_heads=8,
            n_kv_heads=2,
            head_dim=64,
            d_ff=1536,
            window=128,
            architecture="orthros",
            scale_offset=True,
            dtype="float32",  # launch/benchmark.py switches to bfloat16 on accelerators
            param_dtype="float32",
            prefill_chunk=1024,
            attention_block_local=128,  # multi-threaded under default XLA:CPU (suite "window")
            attention_block_q=512,
            attention_block_k=512,
        )
    )
    c.prefill_lengths = (1024, 2048, 4096, 8192, 16384, 32768)
    c.transformer_max_len = 16384  # the quadratic arm takes minutes per call at 32K on 2 CPU cores
    c.dense_max_len = 8192  # honesty check against jax.nn.dot_product_attention
    c.decode_contexts = (1024, 2048, 4096, 8192, 16384)
    c.decode_steps = 16
    c.train_len = 2048
    c.train_batch = 1
    c.window_blocks = (32, 64, 128)  # suite 'window': query block sizes of the window kernel
    c.inference_len = 8192  # suite 'inference': TTFT prompt tokens
    c.inference_new_tokens = 32  # suite 'inference': decode tokens per timed run
    # Suite 'speculative' (benchmarks/spec_suite.py): k drafts per round, draft window = w; the
    # projection's tokens per verify, measured on the trained default job's model at k = 4
    # (docs/speculative.md).
    c.spec_contexts = (1024, 16384)
    c.spec_k = 4
    c.spec_acceptance = 4.33
    c.spec_new_tokens = 16
    c.spec_arms = ("orthros", "transformer")
    # Suite 'table4' (benchmarks/table4.py): the hybrid arms are this model with the
    # (gdn, gdn, gdn, attention) cycle and Qwen3.5's GDN proportions at this width (value heads
    # twice the key heads, dims 64); configs/bench_hybrid.py sizes a run of it for this CPU.
    c.gdn = ml_collections.ConfigDict(  # model.kinds.gdn of the hybrid arms
        dict(num_k_heads=4, num_v_heads=8, k_head_dim=64, v_head_dim=64, conv_kernel=4, chunk=64)
    )
    # Suite 'table4', per-layer decode: pure stacks of each recurrent kind beside the
    # Transformer (all attention), table4_n_layers layers each, so their decode step ratio is a
    # layer's. GLA at fla's proportions for this width (expand_k 0.5, expand_v 1, 4 heads);
    # RetNet with the attention's 8 heads of 64 for keys and values (expand_v 1: at fla's
    # expand_v 2 its q/k/v/gate/out weights are 1.6x an attention layer's, which a CPU decode,
    # bound by reading the weights, pays in full).
    c.gla = ml_collections.ConfigDict(  # model.kinds.gla
        dict(heads=4, kv_heads=4, k_head_dim=64, v_head_dim=128, chunk=64)
    )
    c.ret = ml_collections.ConfigDict(  # model.kinds.retention
        dict(heads=8, kv_heads=8, k_head_dim=64, v_head_dim=64, chunk=64)
    )
    c.table4_layer_arms = ("gdn", "gla", "retnet")
    # Two cycles: with one, the only attention layer is the last, whose base output prefill
    # skips (only its K/V are written), and hybrid and orthros_h would prefill alike.
    c.table4_n_layers = 8
    c.table4_lengths = (1024, 2048, 4096, 8192, 16384)
    c.table4_contexts = (1024, 4096, 8192, 16384)
    c.repeats = 5
    c.batch_size = 1
    c.seed = 0
    return c
