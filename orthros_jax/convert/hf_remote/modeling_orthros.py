"""PyTorch Orthros for `transformers` (trust_remote_code), written by orthros-jax's exporter.

Orthros (arXiv 2610.13735, Sec. 3.1) runs two token streams through every layer with shared
weights. The base stream (every token) attends a window of w keys and writes the layer's full
K/V; the output stream (a copy of a token at the same position) attends every key up to its
own position and produces the logits:
    q  = alpha  * (x  W_Q) + beta      k = x W_K      v = x W_V       (x: the base input)
    q' = alpha' * (x' W_Q) + beta'
    o  = softmax_{t-w < j <= t}(q k^T / sqrt(H)) V        o' = softmax_{j <= t}(q' k^T / sqrt(H)) V
then the shared W_O, residual and SwiGLU FFN, each stream on its own residual path. Orthros-H
adds gated DeltaNet (Qwen3.5) layers: the base stream runs the delta rule; an output copy reads
the state after its token with its own query q' = silu(h' W_q) (no conv), SO before the L2
norm. swa / transformer / hybrid / gdn are the single-stream arms (no output stream). With
ModelConfig.moe some FFNs are mixtures of experts (moe_orthros.py), both streams routed together.

Forward with `logits_to_keep=k` places output copies at the last k new tokens only (generate's
prefill: one copy, so the prompt costs the base stream's window per token); k=0 places one at
every token. With a cache, each call writes the base stream's K/V (full history) and GDN state
into a `transformers` DynamicCache, and decode reads the window for the base query and the
whole cache for the output copy, one token per step.

Shapes: B batch, L new tokens, S cached keys, D hidden, N/K query/kv heads, H head_dim,
Hk/Hv GDN key/value heads, dk/dv their dims, C the GDN conv channels.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_orthros import OrthrosConfig
from .gdn_orthros import GatedDeltaNet
from .moe_orthros import MLP, Experts, SparseMoE

# transformers 5 names the cache field `cache`, 4.x `past_key_values`.
_CACHE_FIELD = (
    "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, zero_centered: bool) -> torch.Tensor:
    """RMSNorm over the last axis, variance in float32; zero_centered: scale 1 + w."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        return (normed * (1.0 + w.float())).to(x.dtype)
    return w.to(x.dtype) * normed.to(x.dtype)


class Norm(nn.Module):
    def __init__(self, dim: int, eps: float, zero_centered: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))
        self.eps, self.zero_centered = eps, zero_centered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.zero_centered)


def rope_inv_freq(config: OrthrosConfig) -> list[float]:
    """Inverse frequencies [R/2] (R: the rotated dims), Llama-3 scaling when configured; plain
    floats (modules may be built on the meta device, where a tensor holds no data)."""
    # transformers' rule: r = int(head_dim * factor), frequencies theta^(-2i / r) for
    # i < ceil(r / 2), so 2 * ceil(r / 2) leading dims rotate (r odd included).
    r = int(config.head_dim * config.partial_rotary_factor)
    inv = [1.0 / (config.rope_theta ** (i / r)) for i in range(0, r, 2)]
    if config.rope_type == "default":
        return inv
    if config.rope_type != "llama3":
        raise ValueError(f"rope_type {config.rope_type!r} is unknown (default, llama3)")
    orig, factor = config.rope_original_max_position, config.rope_factor
    lo, hi = config.rope_low_freq_factor, config.rope_high_freq_factor
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        scaled = f / factor if wavelen > orig / lo else f
        if orig / hi <= wavelen <= orig / lo:
            smooth = (orig / wavelen - lo) / (hi - lo)
            scaled = (1 - smooth) * scaled / factor + smooth * scaled
        out.append(scaled)
    return out


def apply_rope(x_BLNH: torch.Tensor, pos_BL: torch.Tensor, inv_freq: list[float]) -> torch.Tensor:
    """Rotate-half RoPE on the first R dims of each head, at the tokens' original positions."""
    rot = 2 * len(inv_freq)
    inv_freq = torch.tensor(inv_freq, dtype=torch.float32, device=x_BLNH.device)
    ang = pos_BL.float()[..., None] * inv_freq  # [B, L, R/2]
    ang = torch.cat([ang, ang], -1)[:, :, None, :]
    x = x_BLNH.float()
    xr, rest = x[..., :rot], x[..., rot:]
    rotated = torch.cat([-xr[..., rot // 2 :], xr[..., : rot // 2]], -1)
    out = torch.cat([xr * ang.cos() + rotated * ang.sin(), rest], -1)
    return out.to(x_BLNH.dtype)


@dataclasses.dataclass
class Streams:
    """What every layer reads: the base stream and the output copies (None: single stream).

    base [B, L, D]; out [B, L_out, D]; out_index [L_out]: the copies' indices into the L new
    tokens; positions [B, L]: original positions; key_valid [B, S]: cached keys that exist
    (not padding); valid [B, L]: the new tokens that exist; past: tokens cached before them."""

    base: torch.Tensor
    out: torch.Tensor | None
    out_index: torch.Tensor
    positions: torch.Tensor
    key_valid: torch.Tensor | None
    valid: torch.Tensor | None
    past: int


def attend(q_BLNH, k_BSKH, v_BSKH, mask_BLS) -> torch.Tensor:
    """softmax(q k^T / sqrt(H)) v in float32 over the visible keys; query head n reads kv head
    n // (N/K). Returns [B, L, N, H] in q's dtype."""
    n, kv = q_BLNH.shape[2], k_BSKH.shape[2]
    k = k_BSKH.float().repeat_interleave(n // kv, dim=2)
    v = v_BSKH.float().repeat_interleave(n // kv, dim=2)
    scores = torch.einsum("blnh,bsnh->bnls", q_BLNH.float(), k) / math.sqrt(q_BLNH.shape[-1])
    scores = scores.masked_fill(~mask_BLS[:, None], float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1))  # a row with no key: zeros
    return torch.einsum("bnls,bsnh->blnh", weights, v).to(q_BLNH.dtype)


class Attention(nn.Module):
    """One attention layer's mixer for both streams (with its per-stream query SO)."""

    def __init__(self, config: OrthrosConfig, layer_idx: int) -> None:
        super().__init__()
        d, n, k, h = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.config, self.layer_idx, self.n, self.k, self.h = config, layer_idx, n, k, h
        self.q_proj = nn.Linear(d, n * h, bias=False)
        self.k_proj = nn.Linear(d, k * h, bias=False)
        self.v_proj = nn.Linear(d, k * h, bias=False)
        self.o_proj = nn.Linear(n * h, d, bias=False)
        if config.attn_output_gate:
            self.g_proj = nn.Linear(d, n * h, bias=False)
        if config.qk_norm:
            self.q_norm = Norm(h, config.rms_norm_eps, config.norm_zero_centered)
            self.k_norm = Norm(h, config.rms_norm_eps, config.norm_zero_centered)
        if config.scale_offset:
            for stream in ("base", "out"):
                setattr(self, f"so_{stream}_scale", nn.Parameter(torch.ones(n, h)))
                setattr(self, f"so_{stream}_offset", nn.Parameter(torch.zeros(n, h)))
        # Not a buffer: from_pretrained builds modules on the meta device and would leave a
        # non-persistent buffer uninitialised.
        self.inv_freq = rope_inv_freq(config)

    def query(self, h_BLD: torch.Tensor, pos_BL: torch.Tensor, stream: str) -> torch.Tensor:
        """q = alpha * (x W_Q) + beta (after the q norm), then RoPE: [B, L, N, H]."""
        b, seq, _ = h_BLD.shape
        q = self.q_proj(h_BLD).view(b, seq, self.n, self.h)
        if self.config.qk_norm:
            q = self.q_norm(q)
        if self.config.scale_offset:
            q = q * getattr(self, f"so_{stream}_scale") + getattr(self, f"so_{stream}_offset")
        return apply_rope(q, pos_BL, self.inv_freq)

    def finish(self, h_BLD: torch.Tensor, o_BLNH: torch.Tensor) -> torch.Tensor:
        """The output gate (if any) and the shared W_O."""
        b, seq, _ = h_BLD.shape
        if self.config.attn_output_gate:
            gate = self.g_proj(h_BLD).view(b, seq, self.n, self.h)
            o_BLNH = o_BLNH * torch.sigmoid(gate.float()).to(o_BLNH.dtype)
        return self.o_proj(o_BLNH.reshape(b, seq, -1))

    def forward(self, h, h_out, s: Streams, cache: Cache | None):
        """h [B, L, D] (the normed base input), h_out [B, L_out, D] or None -> the mixer
        outputs of both streams (before the residual)."""
        b, seq, _ = h.shape
        k = self.k_proj(h).view(b, seq, self.k, self.h)
        if self.config.qk_norm:
            k = self.k_norm(k)
        k = apply_rope(k, s.positions, self.inv_freq)
        v = self.v_proj(h).view(b, seq, self.k, self.h)
        if cache is not None:  # DynamicLayer keeps [B, K, S, H], the whole history
            ks, vs = cache.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx)
            k, v = ks.transpose(1, 2), vs.transpose(1, 2)
        n_keys = k.shape[1]
        key_slot = torch.arange(n_keys, device=h.device)
        q_slot = s.past + torch.arange(seq, device=h.device)
        visible = key_slot[None, :] <= q_slot[:, None]  # [L, S] causal over cache slots
        if s.key_valid is not None:
            visible = visible[None] & s.key_valid[:, None, :].bool()
        else:
            visible = visible[None].expand(b, -1, -1)
        w = self.config.base_window
        if w is None:
            base = attend(self.query(h, s.positions, "base"), k, v, visible)
        else:
            # The window read: only the keys the base queries can see (the last w - 1 cached
            # slots before the new tokens, and the new tokens themselves).
            lo = max(0, s.past - w + 1)
            near = visible[:, :, lo:] & (q_slot[:, None] - key_slot[None, lo:] < w)[None]
            base = attend(self.query(h, s.positions, "base"), k[:, lo:], v[:, lo:], near)
        base = self.finish(h, base)
        if h_out is None:
            return base, None
        pos_out = s.positions[:, s.out_index]
        out = attend(self.query(h_out, pos_out, "out"), k, v, visible[:, s.out_index])
        return base, self.finish(h_out, out)


class DecoderLayer(nn.Module):
    def __init__(self, config: OrthrosConfig, layer_idx: int) -> None:
        super().__init__()
        eps, zc = config.rms_norm_eps, config.norm_zero_centered
        self.input_layernorm = Norm(config.hidden_size, eps, zc)
        self.post_attention_layernorm = Norm(config.hidden_size, eps, zc)
        # The FFN: a dense SwiGLU or (ModelConfig.moe) a mixture of experts, per mlp_only_layers.
        self.moe = config.is_moe_layer(layer_idx)
        if self.moe:
            self.mlp = SparseMoE(config)
        else:
            self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.linear = config.layer_types[layer_idx] == "linear_attention"
        if self.linear:
            self.linear_attn = GatedDeltaNet(config, layer_idx)
        else:
            self.self_attn = Attention(config, layer_idx)

    def forward(self, s: Streams, cache: Cache | None) -> Streams:
        h = self.input_layernorm(s.base)
        h_out = None if s.out is None else self.input_layernorm(s.out)
        mixer = self.linear_attn if self.linear else self.self_attn
        y, y_out = mixer(h, h_out, s, cache)
        base = s.base + y.to(s.base.dtype)
        out = None if s.out is None else s.out + y_out.to(s.out.dtype)
        normed = self.post_attention_layernorm(base)
        normed_out = None if out is None else self.post_attention_layernorm(out)
        if self.moe:  # both streams at once (paired copies take their base tokens' experts)
            f, f_out = self.mlp(normed, normed_out, s.out_index)
        else:
            f, f_out = self.mlp(normed), None if out is None else self.mlp(normed_out)
        return dataclasses.replace(s, base=base + f, out=None if out is None else out + f_out)


class OrthrosPreTrainedModel(PreTrainedModel):
    config_class = OrthrosConfig
    base_model_prefix = "model"
    _no_split_modules = ["DecoderLayer"]
    _supports_cache_class = True
    _is_stateful = True  # GDN layers keep a recurrent state (no assisted decoding)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear | nn.Embedding | nn.Conv1d):
            with torch.no_grad():
                module.weight.normal_(0.0, std)
        elif isinstance(module, Experts):
            with torch.no_grad():
                module.gate_up_proj.normal_(0.0, std)
                module.down_proj.normal_(0.0, std)


class OrthrosModel(OrthrosPreTrainedModel):
    def __init__(self, config: OrthrosConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = Norm(config.hidden_size, config.rms_norm_eps, config.norm_zero_centered)
        self.post_init()

    def forward(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        logits_to_keep=0,
    ):
        """Final hidden states [B, L_out, D] of the output copies (single-stream arms: of the
        base tokens) at the last `logits_to_keep` new tokens (0: every new token)."""
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        b, seq, _ = x.shape
        past = 0
        if cache is not None and "full_attention" in self.config.layer_types:
            past = cache.get_seq_length(self.config.layer_types.index("full_attention"))
        key_valid = valid = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[1] != past + seq:
                raise ValueError(
                    f"attention_mask must be [B, past + L] = [{b}, {past + seq}] (1 = a real "
                    f"token), got {tuple(attention_mask.shape)}"
                )
            key_valid, valid = attention_mask.bool(), attention_mask[:, past:].bool()
        if position_ids is None:
            if attention_mask is None:
                position_ids = (past + torch.arange(seq, device=x.device))[None].expand(b, -1)
            else:  # left padding: a row's first real token is at position 0
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        keep = seq if logits_to_keep in (0, None) else min(int(logits_to_keep), seq)
        out_index = torch.arange(seq - keep, seq, device=x.device)
        s = Streams(
            x,
            x[:, out_index] if self.config.two_streams else None,
            out_index,
            position_ids,
            key_valid,
            valid,
            past,
        )
        for layer in self.layers:
            s = layer(s, cache)
        final = s.out if self.config.two_streams else s.base[:, out_index]
        return self.norm(final)


class OrthrosForCausalLM(OrthrosPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: OrthrosConfig) -> None:
        super().__init__(config)
        self.model = OrthrosModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits [B, L_out, V] (float32 when the weights are) of the output stream; labels
        [B, L] give the usual shifted next-token loss (with logits_to_keep=0)."""
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        hidden = self.model(
            input_ids,
            attention_mask,
            position_ids,
            cache if use_cache else None,
            inputs_embeds,
            logits_to_keep,
        )
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, **{_CACHE_FIELD: cache if use_cache else None}
        )
