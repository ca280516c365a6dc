"""Experiment 2: byte-level LM on the embedded corpus, one arm per config, equal steps.

    python launch/train.py --config=configs/lm_byte.py:orthros --workdir=runs/lm_orthros
    python launch/experiments.py --experiments=lm --out=runs/exp     # all arms x 3 seeds

Arms (the config argument): transformer | swa | orthros | orthros_noso (scale_offset=False) |
gla | retnet (fla's linear baselines: the token mixer replaced, its heads at fla's proportions
for this width) | mamba2 (Mamba-2's SSD at its proportions) | transformer_moe | orthros_moe |
orthros_moe_independent (the FFN a mixture of experts, docs/moe.md: 8 experts, top-2, each
d_ff / 2 wide, so a token's 2 experts hold the dense FFN's parameters; paired or independent
routing of the output copies). All arms share data, optimizer, budget and the block (width,
layers, FFN active parameters); only the token mixer (model.architecture, scale_offset and the
mixer's own dims) or the FFN (model.moe) differs. T=128 with window 16, so the base stream
sees 1/8 of the context. The variants (orthros_noso, the MoE arms) are orthros_jax/config/arms.py's:
their architecture's fields with the arm's overrides. An override of model.d_ff leaves a MoE
arm's model.moe.d_expert as it is (set it too to keep the active parameters equal).
Sized for 2 CPU cores: 12 runs (4 arms x 3 seeds) in ~10-15 minutes.
"""

import ml_collections

from orthros_jax.config import arms
from orthros_jax.config.moe import dense_equivalent_d_expert
from orthros_jax.evaluation.arms import LM, arms_for

D_FF = 192  # the dense FFN's width; a MoE arm's experts are sized from it

ARMS = {
    "transformer": dict(architecture="transformer", scale_offset=False),
    "swa": dict(architecture="swa", scale_offset=False),
    "orthros": dict(architecture="orthros", scale_offset=True),
    # Table 1's fla baselines at this width, fla's proportions (GLA: expand_k 0.5, expand_v 1;
    # RetNet: expand_k 1, expand_v 2): GLA 2 heads of 16 (keys) / 32 (values), RetNet 4 heads.
    "gla": dict(
        architecture="gla",
        scale_offset=False,
        kinds=dict(gla=dict(heads=2, kv_heads=2, k_head_dim=16, v_head_dim=32)),
    ),
    "retnet": dict(
        architecture="retnet",
        scale_offset=False,
        kinds=dict(retention=dict(heads=4, kv_heads=4, k_head_dim=16, v_head_dim=32)),
    ),
    # Mamba-2 at its proportions (expand 2, head_dim 64), in the shared block (with the FFN);
    # state 16 per head: 2 x 64 x 16 = 2048 state entries, RetNet's 4 x 16 x 32.
    "mamba2": dict(
        architecture="mamba2",
        scale_offset=False,
        kinds=dict(mamba2=dict(heads=2, head_dim=64, state=16)),
    ),
}
# The presets' variants that run here (orthros_noso, the MoE arms): their architecture's
# fields with the arm's overrides.
ARMS.update(
    {
        name: ARMS[arm.architecture] | dict(arm.overrides)
        for name, arm in arms.ARMS.items()
        if arm.is_variant and arm.architecture in ARMS and name in arms_for(LM)
    }
)


def _moe_at_width(fields: dict, d_ff: int) -> dict:
    """An arm's model fields with its MoE (if any) sized at dense width d_ff: d_expert =
    d_ff / top_k (equal active FFN parameters)."""
    if "moe" not in fields:
        return fields
    moe = dict(fields["moe"])
    moe["d_expert"] = dense_equivalent_d_expert(d_ff, moe["top_k"])
    return fields | {"moe": moe}


def get_config(arm: str = "orthros") -> ml_collections.ConfigDict:
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; allowed: {', '.join(ARMS)}")
    c = ml_collections.ConfigDict()
    c.model = ml_collections.ConfigDict(
        dict(
            vocab_size=256,
            d_model=64,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            head_dim=16,
            d_ff=D_FF,
            window=16,
            tie_embeddings=False,
            dtype="float32",
            param_dtype="float32",
            scan_layers=True,
            remat="none",
            attention_block_q=64,
            attention_block_k=64,
            **_moe_at_width(ARMS[arm], D_FF),
        )
    )
    c.data = ml_collections.ConfigDict(
        dict(
            kind="pt",
            corpus=("embedded",),
            tokenizer=ml_collections.config_dict.placeholder(str),
            seq_len=128,
            batch_size=16,
            validation_fraction=0.05,
            seed=0,
        )
    )
    c.optimizer = ml_collections.ConfigDict(
        dict(
            lr=3e-3,
            min_lr_ratio=0.1,
            warmup_steps=20,
            b1=0.9,
            b2=0.95,
            eps=1e-8,
            weight_decay=0.1,
            grad_clip=1.0,
            grad_accum_steps=1,
        )
    )
    c.train = ml_collections.ConfigDict(
        dict(
            steps=200,
            seed=0,
            log_every=25,
            eval_every=0,
            eval_batches=8,
            checkpoint_every=0,
            keep_checkpoints=1,
            async_checkpointing=False,
            data_fingerprints=False,
            progress_bar=False,
        )
    )
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    c.distributed = ml_collections.ConfigDict(
        dict(initialize=False, coordinator_address="", num_processes=-1, process_id=-1)
    )
    c.init_from = ml_collections.config_dict.placeholder(str)
    return c
