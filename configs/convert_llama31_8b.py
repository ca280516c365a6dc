"""The paper's conversion recipe (App. A, Table 6) for Llama-3.1-8B -> Orthros.

    python launch/convert.py --hf_dir=/models/Llama-3.1-8B --out=runs/llama31_8b_orthros \
        --window=128 --param_dtype=float32
    python launch/train.py --config=configs/convert_llama31_8b.py:runs/llama31_8b_orthros \
        --config.data.corpus=/data/cpt/*.jsonl --workdir=runs/llama31_8b_cpt

Argument after ':' = the converted model directory (init_from; default
runs/llama31_8b_orthros); its tokenizer.json is the data tokenizer. Recipe: AdamW lr 3e-5,
10,000 steps with 500 warmup, cosine to min-lr ratio 0.1, weight decay 0.1, sequence length
32768, 8M-token batches (8 rows x 32 accumulation micro-batches x 32768 = 8,388,608 tokens per
update), activation checkpointing, window 128. Betas/eps/clipping are not stated in the paper:
(0.9, 0.95), 1e-8, 1.0. The model section is Llama-3.1-8B's config.json (llama3 rope scaling)
as Orthros with identity scale-offsets; the shape check against init_from catches a mismatch.
Sharding: fsdp over all devices, bf16 activations, fp32 master params and Adam moments, the
splash attention kernels (TPU; --config.model.attention_impl=cudnn on GPUs). 8 rows per
micro-batch: one per chip on v5p:2x2x2 (72 GiB of 95) or 8 x H100 (56 GiB of 80) with the
chunked loss (train.loss_chunk's default; 84 / 67 GiB with the full logits), the smallest
targets it fits (launch/compile.py; 32 rows needed 180 GiB per v5p chip with the full logits).
"""

import os

import ml_collections

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import section
from orthros_jax.data import DataConfig
from orthros_jax.training import DistributedConfig, LoopConfig, MeshConfig, OptimizerConfig

SEQ_LEN, ROWS, ACCUM = 32768, 8, 32  # 8,388,608 tokens per optimizer update
DEFAULT_INIT = "runs/llama31_8b_orthros"

LLAMA31_8B = dict(
    vocab_size=128256,
    d_model=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    d_ff=14336,
    rope_theta=500000.0,
    rope_type="llama3",
    rope_factor=8.0,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_original_max_position=8192,
    norm_eps=1e-5,
    qk_norm=False,
    tie_embeddings=False,
)


def conversion_config(model: dict, init_from: str) -> ml_collections.ConfigDict:
    """Table 6's recipe around a converted model's shapes (shared with convert_qwen3_8b.py)."""
    c = ml_collections.ConfigDict()
    c.model = section(
        ModelConfig(
            **model,
            window=128,
            architecture="orthros",
            scale_offset=True,
            dtype="bfloat16",
            param_dtype="float32",
            scan_layers=True,
            remat="full",  # Table 6: activation checkpointing
            attention_impl="splash",
            attention_block_q=512,
            attention_block_k=1024,
        )
    )
    # Built without the paths (DataConfig checks that files exist), which are set after.
    c.data = section(
        DataConfig(
            kind="pt",
            tokenizer=None,
            seq_len=SEQ_LEN,
            batch_size=ROWS,
            validation_fraction=0.001,
            seed=0,
        )
    )
    c.data.corpus = ("data/cpt/*.jsonl",)  # the continued-pretraining corpus
    c.data.tokenizer = os.path.join(init_from, "tokenizer.json")
    c.optimizer = section(
        OptimizerConfig(
            lr=3e-5,
            min_lr_ratio=0.1,
            warmup_steps=500,
            b1=0.9,
            b2=0.95,
            eps=1e-8,
            weight_decay=0.1,
            grad_clip=1.0,
            grad_accum_steps=ACCUM,
        )
    )
    c.train = section(
        LoopConfig(
            steps=10_000,
            seed=0,
            log_every=10,
            eval_every=500,
            eval_batches=8,
            checkpoint_every=250,
            keep_checkpoints=2,
            async_checkpointing=True,
            data_fingerprints=False,
            progress_bar=True,
        )
    )
    c.mesh = section(MeshConfig(data=1, fsdp=-1, tensor=1))
    c.distributed = section(DistributedConfig())
    c.init_from = init_from
    return c


def get_config(init_from: str = DEFAULT_INIT) -> ml_collections.ConfigDict:
    return conversion_config(LLAMA31_8B, init_from or DEFAULT_INIT)
