"""Continue training a converted model as Orthros: the paper's conversion recipe (Table 6), tiny.

    python launch/convert.py --hf_dir=path/to/hf_model --out=runs/converted --window=128
    python launch/train.py --config=configs/convert_tiny.py:runs/converted --workdir=runs/cpt

The argument after ':' is the model directory to continue from (written by launch/convert.py,
Orthros or Transformer; a Transformer's missing scale-offsets start at the identity). The model
section is read from its model.json, so the shapes always match `init_from`; its tokenizer.json
is the data tokenizer. Table 6 at full scale: AdamW lr 3e-5, 10,000 steps with 500 warmup,
min-lr ratio 0.1, weight decay 0.1, T = 32768, 8M-token batches, activation checkpointing,
w = 128. Here the steps, rows and batch are cut to CPU size; the rest of the recipe is kept
(scale up with --config.train.steps=10000 --config.optimizer.warmup_steps=500
--config.data.seq_len=32768 ...).
"""

import os

import ml_collections

from orthros_jax import checkpoint

PAPER_WINDOW = 128


def get_config(model_dir: str = "") -> ml_collections.ConfigDict:
    if not model_dir:
        raise ValueError(
            "configs/convert_tiny.py needs the converted model directory: "
            "--config=configs/convert_tiny.py:<model dir> (write one with launch/convert.py)"
        )
    model_cfg, tokenizer = checkpoint.read_model_json(model_dir)
    model = model_cfg.to_dict()
    model.update(
        architecture="orthros",
        scale_offset=True,
        # A Transformer dir carries no meaningful window; an Orthros dir keeps its own.
        window=model_cfg.window if model_cfg.architecture == "orthros" else PAPER_WINDOW,
        remat="full",  # Table 6: activation checkpointing
    )
    c = ml_collections.ConfigDict()
    c.model = ml_collections.ConfigDict(model)
    c.data = ml_collections.ConfigDict(
        dict(
            kind="pt",
            corpus=("embedded",),
            tokenizer=tokenizer or ml_collections.config_dict.placeholder(str),
            seq_len=256,
            batch_size=8,
            validation_fraction=0.05,
            seed=0,
        )
    )
    c.optimizer = ml_collections.ConfigDict(
        dict(
            lr=3e-5,
            min_lr_ratio=0.1,
            warmup_steps=5,  # 5% of the steps, as 500 of 10,000
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
            steps=100,
            seed=0,
            log_every=10,
            eval_every=50,
            eval_batches=4,
            checkpoint_every=50,
            keep_checkpoints=2,
            async_checkpointing=True,
            data_fingerprints=False,
            progress_bar=True,
        )
    )
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    c.distributed = ml_collections.ConfigDict(
        dict(initialize=False, coordinator_address="", num_processes=-1, process_id=-1)
    )
    c.init_from = os.path.abspath(model_dir)
    return c
