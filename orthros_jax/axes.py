"""Logical axis names. Parameters, cache states and batches carry them; sharding.RULES maps
them to mesh axes in one table."""

LAYERS = "layers"
VOCAB = "vocab"
EMBED = "embed"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"
BATCH = "batch"
LENGTH = "length"  # a sequence / cache-slot axis
