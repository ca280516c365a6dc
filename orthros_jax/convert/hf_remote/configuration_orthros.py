"""`transformers` config of an Orthros-family model exported by orthros-jax (trust_remote_code).

The fields mirror orthros_jax.config.ModelConfig under Hugging Face names. `architecture` is
one of orthros, swa, transformer, orthros_h, hybrid, gdn; `layer_types` names every layer with
transformers' cache names ("full_attention": an attention layer that keeps its whole K/V
history, which the output stream reads even where the base stream only sees a window;
"linear_attention": a gated DeltaNet layer), so `DynamicCache(config=...)` builds the cache.
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
