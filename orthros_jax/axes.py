"""Every logical axis name, and RULES: the one table mapping them to mesh axes ("data", "fsdp",
"tensor"; "sequence" in an inference mesh). Parameters, cache states and batches carry the
names; parallel/mesh.py turns them into PartitionSpecs (shard_spec).

The rules:
  * batch dims are split over data x fsdp x expert (every device gets distinct examples);
  * parameters are split over fsdp along their embed dim (ZeRO-3 style: all-gathered per use)
    and over tensor along heads / kv heads / mlp / vocab (Megatron-style tensor parallelism);
  * a KV cache's slots (logical "length") are split over sequence (sequence-parallel prefill
    and decode); a mesh without that axis keeps them whole;
  * a mixture-of-experts layer's experts are split over "expert" (expert parallelism,
    layers/expert_parallel.py: tokens all-gathered over the axis, results reduce-scattered);
  * the stacked layer axis and head_dim are never split.
"""

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
# Mixture-of-experts layers: the experts of a stacked expert tensor [E, ...].
EXPERT = "expert"

# The mesh axis a sequence (and a KV cache's slot axis) is split over.
SEQUENCE_AXIS = "sequence"
# The mesh axis a MoE layer's experts are split over (layers/expert_parallel.py); batch rows
# split over it too, outside the experts.
EXPERT_AXIS = "expert"

MeshAxes = str | tuple[str, ...] | None

RULES: dict[str, MeshAxes] = {
    BATCH: ("data", "fsdp", EXPERT_AXIS),
    LENGTH: SEQUENCE_AXIS,
    LAYERS: None,
    VOCAB: "tensor",
    EMBED: "fsdp",
    HEADS: "tensor",
    KV_HEADS: "tensor",
    HEAD_DIM: None,
    MLP: "tensor",
    # GDN layers: key and value heads on the same axis as attention heads (a key head's value
    # heads then live on its device when Hk divides over it); the conv taps stay whole.
    GDN_K_HEADS: "tensor",
    GDN_V_HEADS: "tensor",
    CONV_KERNEL: None,
    # MoE experts over the "expert" mesh axis (MeshConfig.expert; size 1: every expert on
    # every device).
    EXPERT: EXPERT_AXIS,
}
