"""The feed-forward blocks of the exported Orthros (trust_remote_code; imported by
modeling_orthros.py, copied next to it): the dense SwiGLU and orthros-jax's mixture of experts
(ModelConfig.moe), tensor names as transformers' Qwen3-MoE / Qwen3.5-MoE ones.

Routing: router logits x W_r in the model dtype, softmax over the E experts in float32, the k
most probable (ties: the lower index first), renormalised over the k when norm_topk_prob, the
gates cast to the model dtype; y = sum_k gate_k SwiGLU_{e_k}(x), plus
sigmoid(x w_s) SwiGLU_s(x) with a shared expert. An output copy routes itself ("independent")
or takes its base token's k experts and weighs them with its own probabilities at those k,
renormalised the same way ("paired": both copies of a token read the same experts).

Shapes: B batch, L base tokens, Lo output copies, N tokens (flattened), D hidden, E experts,
K experts per token, I an expert's width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """SwiGLU of width f: down(silu(x gate) * (x up))."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def top_k(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) [..., K] of the k largest probabilities along the last axis, ties
    broken towards the lower index (a stable descending sort, as orthros-jax's lax.top_k)."""
    values, indices = torch.sort(probs, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


class Experts(nn.Module):
    """E SwiGLU experts as transformers 5's fused tensors: gate_up_proj [E, 2I, D] (the gate's
    I rows first), down_proj [E, D, I]."""

    def __init__(self, n_experts: int, d: int, width: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * width, d))
        self.down_proj = nn.Parameter(torch.empty(n_experts, d, width))

    def forward(self, x_ND, gates_NK, experts_NK) -> torch.Tensor:
        """sum_k gates[n, k] SwiGLU_{experts[n, k]}(x[n]) [N, D] in x's dtype; each chosen
        expert runs once, on the tokens routed to it."""
        y = torch.zeros_like(x_ND)
        for e in torch.unique(experts_NK).tolist():
            token, slot = torch.nonzero(experts_NK == e, as_tuple=True)
            gate, up = F.linear(x_ND[token], self.gate_up_proj[e]).chunk(2, dim=-1)
            out = F.linear(F.silu(gate) * up, self.down_proj[e])
            y.index_add_(0, token, out * gates_NK[token, slot, None])
        return y


class SparseMoE(nn.Module):
    """One layer's MoE FFN for both streams: mlp.gate (the router, [E, D]), mlp.experts and the
    optional mlp.shared_expert with its mlp.shared_expert_gate [1, D]."""

    def __init__(self, config) -> None:
        super().__init__()
        d, e = config.hidden_size, config.num_experts
        self.k, self.normalize = config.num_experts_per_tok, config.norm_topk_prob
        self.paired = config.paired_routing
        self.gate = nn.Linear(d, e, bias=False)
        self.experts = Experts(e, d, config.moe_intermediate_size)
        self.shared = bool(config.shared_expert_intermediate_size)
        if self.shared:
            self.shared_expert = MLP(d, config.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(d, 1, bias=False)

    def _gates(self, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (w / w.sum(-1, keepdim=True) if self.normalize else w).to(dtype)

    def forward(self, h_BLD, h_out=None, out_index=None):
        """(y [B, L, D], y_out [B, Lo, D] or None) of the normed inputs of the base stream and
        of the output copies h_out [B, Lo, D] of base tokens out_index [Lo]."""
        dt, d = h_BLD.dtype, h_BLD.shape[-1]
        w, experts = top_k(torch.softmax(self.gate(h_BLD).float(), dim=-1), self.k)
        xs, gates, chosen = [h_BLD], [self._gates(w, dt)], [experts]
        if h_out is not None:
            probs_out = torch.softmax(self.gate(h_out).float(), dim=-1)
            if self.paired:
                experts_out = experts[:, out_index]
                w_out = probs_out.gather(-1, experts_out)
            else:
                w_out, experts_out = top_k(probs_out, self.k)
            xs, gates, chosen = (
                xs + [h_out],
                gates + [self._gates(w_out, dt)],
                chosen + [experts_out],
            )
        # Both streams through the experts together: each chosen expert is read once.
        x_ND = torch.cat([x.reshape(-1, d) for x in xs])
        flat = lambda ts: torch.cat([t.reshape(-1, self.k) for t in ts])
        y = self.experts(x_ND, flat(gates), flat(chosen))
        if self.shared:
            y = y + torch.sigmoid(self.shared_expert_gate(x_ND)) * self.shared_expert(x_ND)
        n = h_BLD.shape[0] * h_BLD.shape[1]
        y_out = None if h_out is None else y[n:].view(h_out.shape)
        return y[:n].view(h_BLD.shape), y_out
