"""Benchmark config of the MoE arms (launch/benchmark.py): configs/bench.py's model with every
FFN a mixture of experts (ModelConfig.moe, docs/moe.md) of the dense FFN's active parameters,
so its suites compare Orthros-MoE (paired routing, the two-stream default) with Transformer-MoE
(the same weights, independent routing: a single stream has nothing to pair) against the dense
rows of docs/bench/bench.md. Lengths and rounds sized for a 2-core CPU.

    python launch/benchmark.py --config=configs/bench_moe.py --suites=prefill --out=runs/bench_moe

8 experts, top-2, each d_ff / 2 wide (moe_options.dense_equivalent_d_expert): a token's two
experts hold the dense SwiGLU's parameters; the router adds d_model x 8 per layer. No aux loss
(prefill does not train). Override the MoE with --config.model.moe.<option>=..., e.g.
--config.model.moe.impl=dense (every expert on every token, the reference).
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file
from orthros_jax.config.moe import dense_equivalent_d_expert


def get_config() -> ml_collections.ConfigDict:
    c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py"))
    top_k = 2
    c.model.moe = ml_collections.ConfigDict(
        dict(
            n_experts=8,
            top_k=top_k,
            d_expert=dense_equivalent_d_expert(c.model.d_ff, top_k),
            impl="grouped",
        )
    )
    c.prefill_lengths = (1024, 2048, 4096, 8192)
    c.transformer_max_len = 8192
    c.dense_max_len = 4096
    c.decode_contexts = (1024, 4096, 8192)
    c.repeats = 3
    return c
