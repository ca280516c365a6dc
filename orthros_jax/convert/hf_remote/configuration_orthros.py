"""`transformers` config of an Orthros-family model exported by orthros-jax (trust_remote_code).

The fields mirror orthros_jax.config.ModelConfig under Hugging Face names. `architecture` is
one of orthros, swa, transformer, orthros_h, hybrid, gdn; `layer_types` names every layer with
transformers' cache names ("full_attention": an attention layer that keeps its whole K/V
history, which the output stream reads even where the base stream only sees a window;
"linear_attention": a gated DeltaNet layer), so `DynamicCache(config=...)` builds the cache.
num_experts > 0 (ModelConfig.moe) makes every FFN but those of mlp_only_layers a mixture of
experts (Qwen3-MoE's keys; shared_expert_intermediate_size as Qwen3.5-MoE's); moe_routing is
the output copies' ("paired", "independent"; None: paired for a two-stream architecture);
router_aux_loss_coef / router_z_loss_coef are orthros-jax's training options (not used here).
This file imports only `transformers`; it is copied next to the weights.
"""

from __future__ import annotations

try:
    from transformers import PreTrainedConfig
except ImportError:  # transformers 4.x
    from transformers import PretrainedConfig as PreTrainedConfig

ARCHITECTURES = ("orthros", "swa", "transformer", "orthros_h", "hybrid", "gdn")
TWO_STREAM = ("orthros", "orthros_h")
LAYER_TYPES = ("full_attention", "linear_attention")
ROUTINGS = ("paired", "independent")


class OrthrosConfig(PreTrainedConfig):
    model_type = "orthros"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 256,
        hidden_size: int = 128,
        intermediate_size: int = 384,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        head_dim: int = 32,
        architecture: str = "orthros",
        window: int = 128,
        scale_offset: bool = True,
        layer_types: list[str] | None = None,
        rope_theta: float = 10_000.0,
        rope_type: str = "default",
        rope_factor: float = 1.0,
        rope_low_freq_factor: float = 1.0,
        rope_high_freq_factor: float = 4.0,
        rope_original_max_position: int = 8192,
        partial_rotary_factor: float = 1.0,
        rms_norm_eps: float = 1e-6,
        qk_norm: bool = False,
        attn_output_gate: bool = False,
        norm_zero_centered: bool = False,
        linear_num_key_heads: int = 2,
        linear_num_value_heads: int = 4,
        linear_key_head_dim: int = 32,
        linear_value_head_dim: int = 32,
        linear_conv_kernel_dim: int = 4,
        num_experts: int = 0,
        num_experts_per_tok: int = 2,
        moe_intermediate_size: int = 128,
        norm_topk_prob: bool = True,
        shared_expert_intermediate_size: int = 0,
        mlp_only_layers: list[int] | None = None,
        moe_routing: str | None = None,
        router_aux_loss_coef: float = 0.0,
        router_z_loss_coef: float = 0.0,
        max_position_embeddings: int = 2048,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = False,
        use_cache: bool = True,
        **kwargs,
    ) -> None:
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture={architecture!r} is unknown; allowed: {ARCHITECTURES}")
        if layer_types is None:
            layer_types = ["full_attention"] * num_hidden_layers
        layer_types = list(layer_types)
        if len(layer_types) != num_hidden_layers or set(layer_types) - set(LAYER_TYPES):
            raise ValueError(
                f"layer_types must name each of the {num_hidden_layers} layers with one of "
                f"{LAYER_TYPES}; got {layer_types}"
            )
        if scale_offset and architecture not in TWO_STREAM:
            raise ValueError(f"scale_offset needs a two-stream architecture {TWO_STREAM}")
        mlp_only_layers = list(mlp_only_layers or [])
        if any(not 0 <= i < num_hidden_layers for i in mlp_only_layers):
            raise ValueError(f"mlp_only_layers {mlp_only_layers} must be layer indices")
        if moe_routing not in (None, *ROUTINGS):
            raise ValueError(f"moe_routing={moe_routing!r} is unknown; allowed: {ROUTINGS}")
        if moe_routing == "paired" and architecture not in TWO_STREAM:
            raise ValueError(f"moe_routing='paired' needs a two-stream architecture {TWO_STREAM}")
        if num_experts and not 0 < num_experts_per_tok <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in 1..num_experts={num_experts}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.architecture = architecture
        self.window = window
        self.scale_offset = scale_offset
        self.layer_types = layer_types
        self.rope_theta = rope_theta
        self.rope_type = rope_type
        self.rope_factor = rope_factor
        self.rope_low_freq_factor = rope_low_freq_factor
        self.rope_high_freq_factor = rope_high_freq_factor
        self.rope_original_max_position = rope_original_max_position
        self.partial_rotary_factor = partial_rotary_factor
        self.rms_norm_eps = rms_norm_eps
        self.qk_norm = qk_norm
        self.attn_output_gate = attn_output_gate
        self.norm_zero_centered = norm_zero_centered
        self.linear_num_key_heads = linear_num_key_heads
        self.linear_num_value_heads = linear_num_value_heads
        self.linear_key_head_dim = linear_key_head_dim
        self.linear_value_head_dim = linear_value_head_dim
        self.linear_conv_kernel_dim = linear_conv_kernel_dim
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.norm_topk_prob = norm_topk_prob
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.mlp_only_layers = mlp_only_layers
        self.moe_routing = moe_routing
        self.router_aux_loss_coef = router_aux_loss_coef
        self.router_z_loss_coef = router_z_loss_coef
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def two_streams(self) -> bool:
        return self.architecture in TWO_STREAM

    @property
    def base_window(self) -> int | None:
        """The base stream's window (None: causal over every key)."""
        return None if self.architecture in ("transformer", "hybrid") else self.window

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Whether layer layer_idx's FFN is a mixture of experts (else a dense SwiGLU)."""
        return self.num_experts > 0 and layer_idx not in self.mlp_only_layers

    @property
    def paired_routing(self) -> bool:
        """Do the output copies take their base tokens' experts (moe_routing, resolved)?"""
        return (self.moe_routing or ("paired" if self.two_streams else "independent")) == "paired"
