"""MQAR (Zoology-style multi-query associative recall), one arm per config, same training.

    python launch/mqar.py --out=runs/mqar                      # transformer, swa, orthros
    python launch/mqar.py --out=runs/mqar_gdn --arms=gdn,hybrid,orthros_h
    python launch/mqar.py --out=runs/mqar_linear --arms=gla,retnet
    python launch/mqar.py --out=runs/mqar_moe \
        --arms=transformer_moe,orthros_moe,orthros_moe_independent
    python launch/mqar.py --out=runs/mqar --override=train.steps=300     # every arm

The arms are configs/recall_passkey.py's (configs/lm_byte.py's attention arms, 2 layers, 4 query
/ 2 kv heads, and the GDN arms gdn, hybrid, orthros_h), with d_model 128 (head_dim 32, d_ff 384;
GDN heads of 32, at the model's width as recall_passkey.py's 16 are at 64; the MoE arms' experts
d_ff / top_k = 192 wide, equal active FFN parameters) and window 8. At
d_model 64 the Transformer learns this task too slowly for the CPU budget (held-out answer
loss 1.55 nats after 1000 steps, accuracy 0.34); at 128 it drops
from 1.1 to 0.5 between steps 400 and 450 and reaches 0.01 by step 850 (this data, 2026-12-01).
The drop comes suddenly at a step that depends on the data mix: with lengths 16, 32 and 64 and
800 steps it had not come (Transformer accuracy 0.31), hence 1000 steps on lengths 32 and 64.
Window 8: the two stacked windows of the SWA arm reach 2 x 7 tokens back, so most queries of a
64-token example ask for a pair beyond them.

Every arm trains on the same batches (data/mqar.py: rows of 64 tokens packing examples of one
(length, pairs) shape of the grid) for the same steps and is scored on held-out examples per
(length, pairs) cell and per distance: query accuracy, teacher-forced argmax at each query key
(one token per answer). Vocabulary 32: keys 1..15, values 16..31 (chance 1/16).

Sections: model / optimizer / train / mesh / distributed / init_from as in every training
config; data: MQARConfig fields; eval: MQAREval fields (the scoring grid).
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file, section
from orthros_jax.config.moe import dense_equivalent_d_expert
from orthros_jax.data.mqar import MQARConfig
from orthros_jax.evaluation.mqar_report import MQAREval


def get_config(arm: str = "orthros") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    c = load_config_file(os.path.join(here, f"recall_passkey.py:{arm}"))  # same arms
    c.model.update(dict(vocab_size=32, d_model=128, head_dim=32, d_ff=384, window=8))
    if "moe" in c.model:  # a MoE arm: experts resized at the doubled dense width
        c.model.moe.d_expert = dense_equivalent_d_expert(c.model.d_ff, c.model.moe.top_k)
    kinds = c.model.kinds if "kinds" in c.model else {}  # the recurrent arms' option sections
    if "gdn" in kinds:  # a GDN arm
        kinds.gdn.update(dict(k_head_dim=32, v_head_dim=32))
    for p in ("gla", "retention"):  # fla's baselines: their heads doubled with the width
        if p in kinds:
            kinds[p].update(dict(k_head_dim=32, v_head_dim=64))
    if "mamba2" in kinds:  # Mamba-2: expand 2 at the doubled width
        kinds.mamba2.heads = 4
    c.data = section(
        MQARConfig(
            vocab_size=32,
            seq_len=64,
            batch_size=32,
            train_lengths=(32, 64),
            train_pairs=(4, 8),
        )
    )
    c.optimizer.lr = 3e-3
    c.optimizer.warmup_steps = 50
    c.train.steps = 1000
    c.train.log_every = 50
    c.train.eval_batches = 2
    c.eval = section(
        MQAREval(lengths=(32, 64), pairs=(4, 8), examples=64, distance_bins=(8, 16, 32))
    )
    return c
