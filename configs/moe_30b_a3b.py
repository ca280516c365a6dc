"""A Qwen3-30B-A3B-shaped Orthros (mixture of experts, paired routing) as programs to compile
(launch/compile.py): train at 4K, prefill of one 128K-token prompt, a decode step at a 128K
context, with the experts split over the mesh's `expert` axis (expert parallelism).

    python launch/compile.py --config=configs/moe_30b_a3b.py:train --target=v5p:2x2x2 \
        --out=runs/aot/moe_train_v5p8
    python launch/compile.py --config=configs/moe_30b_a3b.py:prefill --target=h100x8 \
        --config.model.attention_impl=cudnn --out=runs/aot/moe_p128k_h100x8
    python launch/compile.py --config=configs/moe_30b_a3b.py:decode --target=v5p:2x2x2 \
        --out=runs/aot/moe_d128k_v5p8

Argument after ':': "train" (default; a train config: 8 rows x 4096 per micro-batch, AdamW, the
auxiliary losses on), "prefill" or "decode" (inference configs as configs/prefill_8b.py). Model:
Qwen3-30B-A3B's shapes (transformers' Qwen3MoeConfig of the Hub checkpoint): 48 layers of
d_model 2048, 32 query / 4 kv heads of 128 with q/k norm, every FFN a mixture of 128 experts of
width 768, top-8 renormalised, vocabulary 151,936, untied; as Orthros with window 128 and
scale-offsets: 30.5B parameters, 3.3B active per token. Mesh: expert=8 (16 experts per chip;
attention and embeddings replicated, batch rows over the 8 chips).
"""

import ml_collections

from orthros_jax.config import ModelConfig
from orthros_jax.config.cli import section
from orthros_jax.data import DataConfig
from orthros_jax.training import DistributedConfig, LoopConfig, MeshConfig, OptimizerConfig

QWEN3_30B_A3B = dict(
    vocab_size=151936,
    d_model=2048,
    n_layers=48,
    n_heads=32,
    n_kv_heads=4,
    head_dim=128,
    d_ff=6144,  # the config's intermediate_size (no dense layer uses it)
    rope_theta=1000000.0,
    norm_eps=1e-6,
    qk_norm=True,
    tie_embeddings=False,
    moe=dict(n_experts=128, top_k=8, d_expert=768, norm_topk_prob=True, ffn_cycle=("moe",)),
)
SEQ_LEN = 4096
PROMPT = 131072
MODES = ("train", "prefill", "decode")


def model(param_dtype: str, remat: str, aux: bool) -> ModelConfig:
    moe = dict(QWEN3_30B_A3B["moe"]) | (dict(aux_loss_coef=0.001, z_loss_coef=0.001) if aux else {})
    return ModelConfig(
        **(QWEN3_30B_A3B | dict(moe=moe)),
        window=128,
        architecture="orthros",
        scale_offset=True,
        dtype="bfloat16",
        param_dtype=param_dtype,
        scan_layers=True,
        remat=remat,
        prefill_chunk=4096,
        attention_impl="splash",
        attention_block_q=512,
        attention_block_k=512,
    )


def train_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = section(model("float32", "full", aux=True))
    c.data = section(DataConfig(kind="pt", tokenizer=None, seq_len=SEQ_LEN, batch_size=8, seed=42))
    c.data.corpus = ("data/corpus/*.jsonl",)  # set to your shards
    c.data.tokenizer = "data/tokenizer.json"  # a 151,936-id tokenizer.json (Qwen3's)
    c.optimizer = section(
        OptimizerConfig(lr=3e-4, warmup_steps=2000, weight_decay=0.1, grad_accum_steps=16)
    )
    c.train = section(LoopConfig(steps=100000, seed=42, log_every=50, checkpoint_every=1000))
    c.mesh = section(MeshConfig(data=1, fsdp=1, tensor=1, expert=-1))
    c.distributed = section(DistributedConfig())
    c.init_from = ml_collections.config_dict.placeholder(str)
    return c


def inference_config(mode: str) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = section(model("bfloat16", "none", aux=False))
    c.inference = ml_collections.ConfigDict(
        {"mode": mode, "batch_size": 1, "prompt_len": PROMPT, "max_len": PROMPT}
    )
    c.mesh = ml_collections.ConfigDict({"data": 1, "sequence": 1, "tensor": 1, "expert": 8})
    return c


def get_config(mode: str = "train") -> ml_collections.ConfigDict:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    return train_config() if mode == "train" else inference_config(mode)
