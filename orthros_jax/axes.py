"""Every logical axis name. Parameters, cache states and batches carry them; parallel/mesh.py's
RULES maps them to mesh axes in one table."""

LAYERS = "layers"
VOCAB = "vocab"
EMBED = "embed"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"
BATCH = "batch"
LENGTH = "length"  # a sequence / cache-slot axis
# Gated DeltaNet layers: key heads, value heads, the causal conv's taps.
GDN_K_HEADS = "gdn_k_heads"
GDN_V_HEADS = "gdn_v_heads"
CONV_KERNEL = "conv_kernel"
