"""The GPU device check's benchmark (benchmarks/device_check.sh): configs/bench.py's suites at
Table 1's 1.3B shapes (d 2048 x 24 layers, 16 heads of 128, SwiGLU 5632, vocab 32000, window
128), bf16 on the accelerator, prompts of 8K-128K (Fig. 4's range), decode at 8K and 128K, a PT
step of 4 x 2048 tokens, speculative / plain decode at 8K and 128K. Sized for about 8 minutes
on one H100."""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py"))
    c.model.update(
        dict(
            vocab_size=32000,
            d_model=2048,
            n_layers=24,
            n_heads=16,
            n_kv_heads=16,
            head_dim=128,
            d_ff=5632,
            window=128,
            prefill_chunk=4096,
            attention_impl="cudnn",
        )
    )
    c.prefill_lengths = (8192, 32768, 131072)
    c.transformer_max_len = 131072
    c.dense_max_len = 8192
    c.decode_contexts = (8192, 131072)
    c.decode_steps = 16
    c.spec_contexts = (8192, 131072)
    c.train_len = 2048
    c.train_batch = 4
    c.repeats = 3
    return c
