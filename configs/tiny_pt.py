"""The default job: a small byte-level Orthros pretrained on the embedded corpus (2 CPU cores).

    python launch/train.py --config=configs/tiny_pt.py --workdir=runs/tiny

T=256 with window 64, so the base stream really is local (w < T) and the output stream global.
Sized by measurement to learn visibly (validation loss well under the 5.5 nats of uniform bytes)
within ~5 minutes on 2 cores.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = ml_collections.ConfigDict(
        dict(
            vocab_size=256,
            d_model=128,
            n_layers=4,
            n_heads=4,
            n_kv_heads=2,
            head_dim=32,
            d_ff=384,
            window=64,
            architecture="orthros",
            scale_offset=True,
            tie_embeddings=False,
            dtype="float32",
            param_dtype="float32",
            scan_layers=True,
            remat="none",
            attention_block_q=128,
            attention_block_k=128,
        )
    )
    c.data = ml_collections.ConfigDict(
        dict(
            kind="pt",
            corpus=("embedded",),
            tokenizer=ml_collections.config_dict.placeholder(str),
            seq_len=256,
            batch_size=16,
            validation_fraction=0.05,
            seed=0,
        )
    )
    c.optimizer = ml_collections.ConfigDict(
        dict(
            lr=3e-3,
            min_lr_ratio=0.1,
            warmup_steps=30,
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
            steps=300,
            seed=0,
            log_every=10,
            eval_every=50,
            eval_batches=8,
            checkpoint_every=50,
            keep_checkpoints=3,
            async_checkpointing=True,
            data_fingerprints=False,
            progress_bar=True,
        )
    )
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    c.distributed = ml_collections.ConfigDict(
        dict(initialize=False, coordinator_address="", num_processes=-1, process_id=-1)
    )
    c.init_from = ml_collections.config_dict.placeholder(str)
    return c
