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
norm. swa / transformer / hybrid / gdn are the single-stream arms (no output stream).

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


class MLP(nn.Module):
    def __init__(self, config: OrthrosConfig) -> None:
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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
        d, n, k, h = (config.hidden_size, config.num_attention_heads,
                      config.num_key_value_heads, config.head_dim)  # fmt: skip
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


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrent_delta_rule(queries, k, v, beta, g, state):
    """The gated delta rule token by token: S_t = e^g_t S_{t-1} + k_t u_t^T with
    u_t = beta_t (v_t - k_t^T e^g_t S_{t-1}); each query set reads o_t = q_t^T S_t.
    queries: list of [B, L, Hv, dk]; k [B, L, Hv, dk]; v [B, L, Hv, dv]; beta, g [B, L, Hv];
    state [B, Hv, dk, dv] (float32). Returns ([o [B, L, Hv, dv] per query set], state)."""
    outs = [[] for _ in queries]
    for t in range(k.shape[1]):
        state = state * g[:, t, :, None, None].exp()
        mem = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        delta = beta[:, t, :, None] * (v[:, t] - mem)
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        for out, q in zip(outs, queries, strict=True):
            out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return [torch.stack(o, 1) for o in outs], state


def chunked_delta_rule(queries, k, v, beta, g, state, chunk: int = 64):
    """recurrent_delta_rule's result, a chunk of C tokens at a time. Inside a chunk with
    cumulative log-decay c_i, S_i = e^c_i S_0 + sum_{j<=i} e^(c_i - c_j) k_j u_j^T, so the
    updates U solve (I + A) U = beta V - (beta K e^c) S_0 with A_ij = beta_i (k_i . k_j)
    e^(c_i - c_j) for j < i (unit lower triangular), and o_i = e^c_i q_i^T S_0 +
    sum_{j<=i} e^(c_i - c_j) (q_i . k_j) u_j. Padding the last chunk with beta = g = 0
    leaves the state unchanged."""
    b, seq, hv, _ = k.shape
    pad = (-seq) % chunk

    def chunks(x):  # [B, L, Hv, ...] -> [B, Hv, n, C, ...]
        x = x.transpose(1, 2)
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
        return x.reshape(b, hv, -1, chunk, *x.shape[3:])

    qs = [chunks(q.float()) for q in queries]
    kc, vc, bc, gc = chunks(k.float()), chunks(v.float()), chunks(beta), chunks(g)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).triu(1)  # j > i
    outs = [[] for _ in queries]
    for n in range(kc.shape[2]):
        kn, vn, bn = kc[:, :, n], vc[:, :, n], bc[:, :, n, :, None]
        c = gc[:, :, n].cumsum(-1)  # [B, Hv, C]
        decay = (c[..., :, None] - c[..., None, :]).masked_fill(later, float("-inf")).exp()
        a = (bn * (kn @ kn.transpose(-1, -2)) * decay).tril(-1)
        eye = torch.eye(chunk, device=k.device)
        rhs = torch.cat([bn * vn, bn * kn * c.exp()[..., None]], -1)
        sol = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        u = sol[..., : vn.shape[-1]] - sol[..., vn.shape[-1] :] @ state  # [B, Hv, C, dv]
        for out, q in zip(outs, qs, strict=True):
            qn = q[:, :, n]
            out.append(
                (qn * c.exp()[..., None]) @ state + ((qn @ kn.transpose(-1, -2)) * decay) @ u
            )
        last = c[..., -1:]  # [B, Hv, 1]
        state = (
            state * last.exp()[..., None] + (kn * (last - c).exp()[..., None]).transpose(-1, -2) @ u
        )
    return [torch.cat(o, 2)[:, :, :seq].transpose(1, 2) for o in outs], state


class GatedDeltaNet(nn.Module):
    """Qwen3.5's gated DeltaNet mixer (tensor names as transformers' Qwen3_5GatedDeltaNet),
    with the Orthros-H cross query of the output copies.

    q, k, v = silu(causal depthwise conv(h W_qkv)); q, k L2-normalised, q scaled by dk^-1/2;
    beta = sigmoid(h W_b), g = -exp(A_log) softplus(h W_a + dt_bias);
    S_t = e^g S_{t-1} + k_t (beta (v_t - k_t S'))^T with S' = e^g S_{t-1};  o_t = q_t S_t;
    output copy of token t: o'_t = q'_t S_t, q' = l2norm(alpha * silu(h' W_q) + beta) dk^-1/2;
    y = W_out(RMSNorm_w(o) * silu(h W_z)) per value head (z' from h' for the copy)."""

    def __init__(self, config: OrthrosConfig, layer_idx: int) -> None:
        super().__init__()
        d = config.hidden_size
        self.hk, self.hv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.kc, self.layer_idx, self.eps = (
            config.linear_conv_kernel_dim,
            layer_idx,
            config.rms_norm_eps,
        )
        self.conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        self.in_proj_qkv = nn.Linear(d, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(d, self.hv * self.dv, bias=False)
        self.in_proj_b = nn.Linear(d, self.hv, bias=False)
        self.in_proj_a = nn.Linear(d, self.hv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kc, groups=self.conv_dim,
                                bias=False, padding=self.kc - 1)  # fmt: skip
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(self.dv))
        self.out_proj = nn.Linear(self.hv * self.dv, d, bias=False)
        self.cross_so = config.scale_offset
        if config.scale_offset:
            self.so_out_scale = nn.Parameter(torch.ones(self.hk, self.dk))
            self.so_out_offset = nn.Parameter(torch.zeros(self.hk, self.dk))

    def _value_heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(self.hv // self.hk, dim=-2)

    def _finish(self, o_BLHV: torch.Tensor, h_BLD: torch.Tensor) -> torch.Tensor:
        """Gated RMSNorm per value head (cast where Qwen3_5RMSNormGated casts), then W_out."""
        dt = h_BLD.dtype
        z = self.in_proj_z(h_BLD).view(*h_BLD.shape[:2], self.hv, self.dv).float()
        o = o_BLHV.to(dt).float()
        normed = (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)).to(dt)
        gated = (normed * self.norm.weight.to(dt)).float() * F.silu(z)
        return self.out_proj(gated.to(dt).reshape(*h_BLD.shape[:2], -1))

    def forward(self, h, h_out, s: Streams, cache: Cache | None):
        b, seq, _ = h.shape
        if s.valid is not None:  # padding moves neither the conv window nor the state
            h = h * s.valid[..., None].to(h.dtype)
        mixed = self.in_proj_qkv(h).transpose(1, 2)  # [B, C, L]
        if cache is not None:
            # Prefill: the new inputs (padded to the kernel); later calls: the cached last Kc
            # inputs before them. Either way a causal conv over it ends with the L new outputs.
            mixed = cache.update_conv_state(mixed, self.layer_idx, conv_kernel_size=self.kc)
        conv = F.conv1d(mixed, self.conv1d.weight, padding=self.kc - 1, groups=self.conv_dim)
        x = F.silu(conv[:, :, : mixed.shape[-1]][:, :, -seq:]).transpose(1, 2)  # [B, L, C]
        qd = self.hk * self.dk
        q = x[..., :qd].reshape(b, seq, self.hk, self.dk)
        k = x[..., qd : 2 * qd].reshape(b, seq, self.hk, self.dk)
        v = x[..., 2 * qd :].reshape(b, seq, self.hv, self.dv).float()
        q = self._value_heads(l2norm(q.float()) * self.dk**-0.5)
        k = self._value_heads(l2norm(k.float()))
        beta = torch.sigmoid(self.in_proj_b(h).float())  # [B, L, Hv]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(h).float() + self.dt_bias.float())
        if s.valid is not None:
            beta, g = beta * s.valid[..., None], g * s.valid[..., None]
        cross = None
        if h_out is not None:
            # Each copy's query sits at its base token so the rule reads S_t for it.
            qc = self.in_proj_qkv(h_out)[..., :qd].reshape(b, -1, self.hk, self.dk).float()
            qc = F.silu(qc)
            if self.cross_so:
                qc = qc * self.so_out_scale.float() + self.so_out_offset.float()
            cross = torch.zeros(b, seq, self.hv, self.dk, device=h.device)
            cross[:, s.out_index] = self._value_heads(l2norm(qc) * self.dk**-0.5)
        state = None if cache is None else cache.get_recurrent_state(self.layer_idx)
        if state is None:
            state = torch.zeros(b, self.hv, self.dk, self.dv, device=h.device)
        queries = [q] if cross is None else [q, cross]
        rule = recurrent_delta_rule if seq == 1 else chunked_delta_rule
        outs, state = rule(queries, k, v, beta, g, state.float())
        if cache is not None:
            cache.update_recurrent_state(state, self.layer_idx)
        y = self._finish(outs[0], h)
        if cross is None:
            return y, None
        return y, self._finish(outs[1][:, s.out_index], h_out)


class DecoderLayer(nn.Module):
    def __init__(self, config: OrthrosConfig, layer_idx: int) -> None:
        super().__init__()
        eps, zc = config.rms_norm_eps, config.norm_zero_centered
        self.input_layernorm = Norm(config.hidden_size, eps, zc)
        self.post_attention_layernorm = Norm(config.hidden_size, eps, zc)
        self.mlp = MLP(config)
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

        def ffn(x, mixed):
            x = x + mixed.to(x.dtype)
            return x + self.mlp(self.post_attention_layernorm(x))

        out = None if s.out is None else ffn(s.out, y_out)
        return dataclasses.replace(s, base=ffn(s.base, y), out=out)


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


class OrthrosModel(OrthrosPreTrainedModel):
    def __init__(self, config: OrthrosConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = Norm(config.hidden_size, config.rms_norm_eps, config.norm_zero_centered)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                inputs_embeds=None, logits_to_keep=0):  # fmt: skip
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
        s = Streams(x, x[:, out_index] if self.config.two_streams else None, out_index,
                    position_ids, key_valid, valid, past)  # fmt: skip
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
        hidden = self.model(input_ids, attention_mask, position_ids, cache if use_cache else None,
                            inputs_embeds, logits_to_keep)  # fmt: skip
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
