"""Issue 35's acceptance on the bench-shape model: configs/bench.py's model (d_model 512, 4 layers,
8 heads / 2 KV heads of 64, d_ff 1536, window 128) pretrained on the embedded corpus the way
configs/tiny_pt.py trains the default job (docs/speculative.md, "The bench-shape model").

    python launch/train.py --config=configs/spec_bench.py --workdir=runs/spec_bench
    python launch/train.py --config=configs/draft_so.py:128,spec_bench \
        --config.init_from=runs/spec_bench --config.train.steps=60 \
        --workdir=runs/spec_bench_draft_so

T = 512 = 4w, so the base stream is local and a draft window of 4w is still shorter than the
1024-byte prompts the acceptance suite feeds it. Steps and batch are sized for 2 shared CPU
cores (under 20 minutes); the model is weak, and its acceptance is reported next to its eval loss.
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file


def get_config() -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, "tiny_pt.py"))
    # configs/bench.py's model field for field (its block sizes and prefill chunk included).
    c.model.update(load_config_file(os.path.join(here, "bench.py")).model)
    c.data.seq_len = 512
    c.data.batch_size = 4
    c.train.steps = 120
    c.train.eval_every = 60
    c.train.checkpoint_every = 60
    c.optimizer.lr = 1e-3
    c.optimizer.warmup_steps = 12
    return c
