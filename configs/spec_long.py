"""Issue 35's speed on this CPU: a small byte-level model of either arm, trained at T = 2048 on
the embedded corpus, whose self-speculative decode benchmarks/speculative.py times at contexts
1K -> 32K (docs/speculative.md, "Speed").

    python launch/train.py --config=configs/spec_long.py --workdir=runs/spec_long_orthros
    python launch/train.py --config=configs/spec_long.py:transformer \
        --workdir=runs/spec_long_transformer

The argument picks the arm (orthros, the default, or transformer: the same shape without the
base stream's window and the scale-offsets), so both arms share shape, data, steps and seed.
Small on purpose: at long context a decode step of this model reads far more cache than weights
(512 bytes of K/V per token and layer against ~0.8 MB of weights per layer), the regime where
speculation pays. T = 2048 is the longest context two shared CPU cores train both arms at in the
session's budget (150 steps of 4096 tokens, about 10 + 7 minutes); 16K-32K prompts are then
8-16x the trained length (no RoPE scaling: scaling without long-context training does not make
those positions seen), so the benchmark reports the acceptance at every context next to the
speed.
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file


def get_config(arm: str = "orthros") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, "tiny_pt.py"))
    if arm == "transformer":
        c.model.architecture = "transformer"
        c.model.scale_offset = False
    elif arm != "orthros":
        raise ValueError(f"configs/spec_long.py: arm must be orthros or transformer, got {arm!r}")
    c.model.window = 128
    c.model.prefill_chunk = 2048
    c.model.attention_block_q = 512  # 1.4x tiny_pt.py's 128 at T = 2048 on this CPU (1024: slower)
    c.model.attention_block_k = 512
    c.data.seq_len = 2048
    c.data.batch_size = 2
    c.train.steps = 150
    c.train.eval_every = 75
    c.train.checkpoint_every = 75
    c.optimizer.warmup_steps = 15
    return c
