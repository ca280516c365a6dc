"""Experiment 1: recall beyond the window. Passkey retrieval at context 8 x window, per arm.

    python launch/train.py --config=configs/recall_passkey.py:orthros --workdir=runs/rc_orthros
    python launch/evaluate.py --model=runs/rc_orthros --out=runs/rc_orthros_eval \
        --config.tasks=passkey --config.context_lengths=128,192,256
    python launch/experiments.py --experiments=recall --out=runs/exp     # the attention arms
    python launch/experiments.py --experiments=recall --arms=gdn,hybrid,orthros_h --out=runs/g
    python launch/experiments.py --experiments=recall --arms=gla,retnet --out=runs/linear

SFT on generated passkey examples (data/recall.py): a 2-digit key hidden at a random depth
of 128 tokens of filler, asked for at the end; loss and output copies only on the answer.
(2 digits, not the classic 5: the retrieval is the same, and a 2-layer byte model learns the
copy within the CPU budget; with 5 digits it needs thousands of steps.)
The window is 16, so from the question the needle is always >= 39 tokens back: beyond the
window of the base stream (and of the SWA arm, whose 2 layers reach 2 x 15 tokens back).
Arms: transformer | swa | orthros | orthros_noso, identical except for the attention; and the
gated-DeltaNet arms gdn (both layers GDN), hybrid (GDN then full attention) and orthros_h
(GDN then an Orthros layer, the GDN layer's output copies reading the base state), and fla's
linear baselines gla and retnet (configs/lm_byte.py's arms): the same data, budget and block,
the token mixer of the layers the only difference.
"""

import os

import ml_collections

from orthros_jax.config.cli import load_config_file

# GDN arms: the architecture, its 2-layer cycle, and GDN heads at the model's width (d 64).
GDN_ARMS = {
    "gdn": dict(architecture="gdn", layer_types=("gdn",)),
    "hybrid": dict(architecture="hybrid", layer_types=("gdn", "attention")),
    "orthros_h": dict(architecture="orthros_h", layer_types=("gdn", "attention")),
}
GDN_DIMS = dict(
    kinds=dict(gdn=dict(num_k_heads=2, num_v_heads=4, k_head_dim=16, v_head_dim=16, chunk=64))
)


def get_config(arm: str = "orthros") -> ml_collections.ConfigDict:
    here = os.path.dirname(os.path.abspath(__file__))
    base_arm = "transformer" if arm in GDN_ARMS else arm
    c = load_config_file(os.path.join(here, f"lm_byte.py:{base_arm}"))  # same model, same arms
    if arm in GDN_ARMS:
        c.model.update(dict(GDN_ARMS[arm], scale_offset=arm == "orthros_h", **GDN_DIMS))
    c.data = ml_collections.ConfigDict(
        dict(
            kind="sft",
            sft_task="passkey",
            recall_filler="fixed",
            recall_context=128,
            recall_passkey_digits=2,
            tokenizer=ml_collections.config_dict.placeholder(str),
            seq_len=128,
            out_len=4,
            batch_size=16,
            seed=0,
        )
    )
    c.optimizer.lr = 3e-3
    c.optimizer.warmup_steps = 20
    c.train.steps = 600
    c.train.eval_batches = 4
    return c
