"""The paper's 1.3B pretraining recipe (App. A, Table 5 ablations / Table 1 main run).

    python launch/train.py --config=configs/pt_1p3b.py --workdir=gs://.../orthros_1p3b \
        --config.data.corpus=/data/fineweb-edu/*.jsonl --config.data.tokenizer=/data/tokenizer.json

Argument after ':': "100b" (default, Table 1: 100B FineWeb-Edu tokens in 2M-token batches,
1024 x 2048 = 2,097,152: 47,683 steps) or "10b" (Table 5's ablation budget: 0.25M-token
batches, 128 x 2048 = 262,144: 38,146 steps). Each update is micro-batches of 16 rows (64 of
them for 100b, 8 for 10b): 4 rows per chip on v6e:2x2 / v5p:2x2x1, 1 per chip on v5e:4x4, the
smallest slices it fits (docs/tpu-gpu.md: launch/compile.py's figures). configs/pt_1p3b_swa.py is Table 1's SWA
baseline. Recipe: AdamW, lr 3e-4, cosine, 1500 warmup steps, weight decay 0.05, sequence
length 2048, seed 42, window 128. The paper does not state min-lr ratio, betas, eps or
clipping, nor whether Table 1 changes lr or warmup with its larger batch; we use the common
0.1, (0.9, 0.95), 1e-8 and 1.0, and Table 5's lr and warmup for both budgets. Model: Llama-style 2048 x 24 layers, 16 heads of 128, SwiGLU 5632,
32000 vocab (a Llama-2 style tokenizer.json), untied: 1.36B parameters.
Sharding: fully sharded data parallel over all devices (fsdp=-1); bf16 activations, fp32
params and optimizer state, dots-saveable rematerialisation, the splash attention kernels (TPU;
"cudnn" on GPUs, "xla" on CPU: --config.model.attention_impl=...).
"""

import ml_collections

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import section
from orthros_jax.data import DataConfig
from orthros_jax.training import DistributedConfig, LoopConfig, MeshConfig, OptimizerConfig

SEQ_LEN = 2048
# budget -> (tokens, sequences per update): Table 1's 2M-token batch, Table 5's 0.25M.
BUDGETS = {"100b": (100e9, 1024), "10b": (10e9, 128)}
ROWS = 16  # rows per micro-batch (launch/compile.py: what fits per chip, see the docstring)


def get_config(budget: str = "100b") -> ml_collections.ConfigDict:
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; allowed: {', '.join(BUDGETS)}")
    tokens, batch = BUDGETS[budget]
    c = ml_collections.ConfigDict()
    c.model = section(
        ModelConfig(
            vocab_size=32000,
            d_model=2048,
            n_layers=24,
            n_heads=16,
            n_kv_heads=16,
            head_dim=128,
            d_ff=5632,
            window=128,
            architecture="orthros",
            scale_offset=True,
            rope_theta=10000.0,
            norm_eps=1e-6,
            tie_embeddings=False,
            dtype="bfloat16",
            param_dtype="float32",
            scan_layers=True,
            remat="dots",
            attention_impl="splash",
            attention_block_q=512,
            attention_block_k=512,
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
            seed=42,
        )
    )
    c.data.corpus = ("data/fineweb-edu/*.jsonl",)  # set to your FineWeb-Edu shards
    c.data.tokenizer = "data/tokenizer.json"  # a 32000-id tokenizer.json
    c.optimizer = section(
        OptimizerConfig(
            lr=3e-4,
            min_lr_ratio=0.1,
            warmup_steps=1500,
            b1=0.9,
            b2=0.95,
            eps=1e-8,
            weight_decay=0.05,
            grad_clip=1.0,
            grad_accum_steps=batch // ROWS,
        )
    )
    c.train = section(
        LoopConfig(
            steps=int(tokens // (SEQ_LEN * batch)),  # 47,683 (100B) / 38,146 (10B)
            seed=42,
            log_every=50,
            eval_every=2000,
            eval_batches=32,
            checkpoint_every=2000,
            keep_checkpoints=3,
            async_checkpointing=True,
            data_fingerprints=False,
            progress_bar=True,
        )
    )
    c.mesh = section(MeshConfig(data=1, fsdp=-1, tensor=1))
    c.distributed = section(DistributedConfig())
    c.init_from = ml_collections.config_dict.placeholder(str)
    return c
