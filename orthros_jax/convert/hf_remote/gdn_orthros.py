"""The gated DeltaNet layer of the exported Orthros-H (trust_remote_code; imported by
modeling_orthros.py, copied next to it): Qwen3.5's mixer with the output copies' cross read,
the delta rule in chunked form for prompts and recurrent form for decode.

Shapes: B batch, L new tokens, Hk/Hv key/value heads, dk/dv their dims, C conv channels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache


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

    def __init__(self, config, layer_idx: int) -> None:
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
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            self.kc,
            groups=self.conv_dim,
            bias=False,
            padding=self.kc - 1,
        )
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

    def forward(self, h, h_out, s, cache: Cache | None):
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
