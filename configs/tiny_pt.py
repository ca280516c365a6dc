"""The default job: a small byte-level Orthros pretrained on the embedded corpus (2 CPU cores).

    python launch/train.py --config=configs/tiny_pt.py --workdir=runs/tiny

T=256 with window 64, so the base stream really is local (w < T) and the output stream global.
Sized by measurement to learn visibly (validation loss well under the 5.5 nats of uniform bytes)
within ~5 minutes on 2 cores. Every field of every section is listed (from the dataclasses'
values), so any of them can be overridden: --config.model.rope_theta=5e5, ...
"""

import ml_collections

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import section
from orthros_jax.data import DataConfig
from orthros_jax.training import DistributedConfig, LoopConfig, MeshConfig, OptimizerConfig


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = section(
        ModelConfig(
            vocab_size=256,
            d_model=128,
            n_layers=3,
            n_heads=4,
            n_kv_heads=2,
            head_dim=32,
            d_ff=384,
            window=64,
            architecture="orthros",
            scale_offset=True,
            dtype="float32",
            param_dtype="float32",
            attention_block_q=128,
            attention_block_k=128,
        )
    )
    c.data = section(
        DataConfig(
            kind="pt",
            corpus=("embedded",),
            tokenizer=None,
            seq_len=256,
            batch_size=16,
            validation_fraction=0.05,
            seed=0,
        )
    )
    c.optimizer = section(
        OptimizerConfig(
            lr=3e-3,
            min_lr_ratio=0.1,
            warmup_steps=30,
            b1=0.9,
            b2=0.95,
            weight_decay=0.1,
            grad_clip=1.0,
            grad_accum_steps=1,
        )
    )
    c.train = section(
        LoopConfig(
            steps=300,
            seed=0,
            log_every=10,
            eval_every=50,
            eval_batches=8,
            checkpoint_every=50,
            keep_checkpoints=3,
        )
    )
    c.mesh = section(MeshConfig(data=-1, fsdp=1, tensor=1))
    c.distributed = section(DistributedConfig())
    c.init_from = ml_collections.config_dict.placeholder(str)
    return c
