"""Mixture-of-experts math, no parameters: routing (own or paired), the experts' SwiGLU (grouped
or dense) and the router statistics of the auxiliary losses.

Shapes: N tokens (flattened), D d_model, E experts, K experts per token (top-k), I an
expert's intermediate size.

Routing follows transformers' Qwen3-MoE / Qwen3.5-MoE router: logits in the model dtype, softmax
over experts in float32, top-k, optionally renormalised over the k chosen (norm_topk_prob),
then cast back to the model dtype. Paired routing (Orthros): an output copy takes its base
token's k experts and weighs them with its own probabilities over those k, renormalised the
same way.

Two implementations of the experts compute the same function:
  grouped  the N*K (token, expert) pairs sorted by expert, three `jax.lax.ragged_dot` grouped
           matmuls (each expert's weights read once for all its tokens), unsorted and combined;
  dense    every expert on every token, then the gate-weighted sum (the reference).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def router_probs(logits_NE: jax.Array) -> jax.Array:
    """Float32 softmax over experts."""
    return jax.nn.softmax(logits_NE.astype(jnp.float32), axis=-1)


def _renorm(w_NK: jax.Array, normalize: bool) -> jax.Array:
    return w_NK / jnp.sum(w_NK, axis=-1, keepdims=True) if normalize else w_NK


def top_k_route(
    probs_NE: jax.Array, k: int, normalize: bool, dtype: jnp.dtype
) -> tuple[jax.Array, jax.Array]:
    """A token's own routing: (gate weights [N, K] in dtype, experts [N, K] int32), the k most
    probable experts (ties: the lower index first, as torch.topk), weights renormalised over
    the k when `normalize`."""
    w, idx = jax.lax.top_k(probs_NE, k)
    return _renorm(w, normalize).astype(dtype), idx.astype(jnp.int32)


def paired_gates(
    probs_NE: jax.Array, experts_NK: jax.Array, normalize: bool, dtype: jnp.dtype
) -> jax.Array:
    """Gate weights [N, K] in dtype of tokens routed to given experts (an output copy to its
    base token's): each token's own probabilities at those experts, renormalised over the k
    when `normalize` (as its own top-k would be)."""
    w = jnp.take_along_axis(probs_NE, experts_NK, axis=-1)
    return _renorm(w, normalize).astype(dtype)


def experts_dense(
    x_ND: jax.Array,
    w_gate_EDI: jax.Array,
    w_up_EDI: jax.Array,
    w_down_EID: jax.Array,
    gates_NK: jax.Array,
    experts_NK: jax.Array,
    first: int | jax.Array = 0,
) -> jax.Array:
    """sum_k gates[n, k] * SwiGLU_{experts[n, k]}(x[n]) by running every expert on every token
    (the reference: O(N * E) work). The weights may be a slice of the experts, ids first ..
    first + E - 1 (expert parallelism: one device's experts); a choice of another expert adds
    nothing. Returns [N, D] in x's dtype."""
    dt = x_ND.dtype
    n_experts = w_gate_EDI.shape[0]
    gate = jnp.einsum("nd,edi->nei", x_ND, w_gate_EDI.astype(dt))
    up = jnp.einsum("nd,edi->nei", x_ND, w_up_EDI.astype(dt))
    y_NED = jnp.einsum("nei,eid->ned", jax.nn.silu(gate) * up, w_down_EID.astype(dt))
    # one_hot of an id outside 0 .. E - 1 is all zeros: other devices' experts drop out.
    onehot = jax.nn.one_hot(experts_NK - first, n_experts, dtype=dt)  # [N, K, E]
    combine_NE = jnp.einsum("nk,nke->ne", gates_NK.astype(dt), onehot)
    return jnp.einsum("ne,ned->nd", combine_NE, y_NED)


def experts_grouped(
    x_ND: jax.Array,
    w_gate_EDI: jax.Array,
    w_up_EDI: jax.Array,
    w_down_EID: jax.Array,
    gates_NK: jax.Array,
    experts_NK: jax.Array,
    first: int | jax.Array = 0,
) -> jax.Array:
    """The same as experts_dense, dropless: the N*K (token, expert) pairs sorted by expert, one
    ragged_dot per projection over the groups (each expert reads only its tokens; no token is
    dropped, whatever the imbalance). With a slice of the experts (ids first .. first + E - 1)
    the pairs of other experts sort after the last group and add nothing. Returns [N, D] in
    x's dtype."""
    dt = x_ND.dtype
    n, k = experts_NK.shape
    n_experts = w_gate_EDI.shape[0]
    local = experts_NK.reshape(-1) - first  # [N*K]
    mine = (local >= 0) & (local < n_experts)
    key = jnp.where(mine, local, n_experts)  # other devices' pairs: one group past the last
    order = jnp.argsort(key, stable=True)
    sizes = jnp.bincount(key, length=n_experts + 1)[:n_experts].astype(jnp.int32)  # [E]
    xs = jnp.take(x_ND, order // k, axis=0)  # [N*K, D], grouped by expert
    gate = jax.lax.ragged_dot(xs, w_gate_EDI.astype(dt), sizes)
    up = jax.lax.ragged_dot(xs, w_up_EDI.astype(dt), sizes)
    ys = jax.lax.ragged_dot(jax.nn.silu(gate) * up, w_down_EID.astype(dt), sizes)  # [N*K, D]
    # Rows past the groups (other experts' pairs) are zeroed explicitly, not left to the op.
    ys = jnp.where(jnp.take(mine, order)[:, None], ys, 0)
    y_NKD = jnp.zeros_like(ys).at[order].set(ys).reshape(n, k, -1)
    return jnp.einsum("nk,nkd->nd", gates_NK.astype(dt), y_NKD)


def experts(
    impl: str,
    x_ND: jax.Array,
    w_gate_EDI: jax.Array,
    w_up_EDI: jax.Array,
    w_down_EID: jax.Array,
    gates_NK: jax.Array,
    experts_NK: jax.Array,
    first: int | jax.Array = 0,
) -> jax.Array:
    """experts_grouped or experts_dense by name (moe_options.MOE_IMPLS: "grouped", "dense")."""
    fn = experts_grouped if impl == "grouped" else experts_dense
    return fn(x_ND, w_gate_EDI, w_up_EDI, w_down_EID, gates_NK, experts_NK, first)


def router_stats(
    logits_NE: jax.Array, probs_NE: jax.Array, experts_NK: jax.Array, valid_N: jax.Array
) -> dict[str, jax.Array]:
    """Sums over the valid tokens (float32) for the auxiliary losses: count [K, E] (how often
    expert e was the k-th choice), prob [E] (router probabilities), z (logsumexp(logits)^2),
    tokens (how many)."""
    v = valid_N.astype(jnp.float32)
    onehot = jax.nn.one_hot(experts_NK, probs_NE.shape[-1], dtype=jnp.float32)  # [N, K, E]
    lse = jax.nn.logsumexp(logits_NE.astype(jnp.float32), axis=-1)
    return {
        "count": jnp.einsum("n,nke->ke", v, onehot),
        "prob": jnp.einsum("n,ne->e", v, probs_NE),
        "z": jnp.sum(v * lse**2),
        "tokens": jnp.sum(v),
    }


def load_balancing_loss(stats: dict[str, jax.Array]) -> jax.Array:
    """transformers' load_balancing_loss_func from summed router_stats (over every MoE layer
    and token): E * sum_{k, e} mean(one-hot choice)[k, e] * mean(prob)[e]."""
    n = jnp.maximum(stats["tokens"], 1.0)
    n_experts = stats["prob"].shape[-1]
    return n_experts * jnp.sum((stats["count"] / n) * (stats["prob"] / n)[None])


def z_loss(stats: dict[str, jax.Array]) -> jax.Array:
    """Router z-loss (ST-MoE): the mean over tokens and MoE layers of logsumexp(logits)^2."""
    return stats["z"] / jnp.maximum(stats["tokens"], 1.0)


def expert_load(stats: dict[str, jax.Array]) -> jax.Array:
    """[E] the fraction of (token, choice) pairs each expert received (sums to 1)."""
    count = jnp.sum(stats["count"], axis=0)
    return count / jnp.maximum(jnp.sum(count), 1.0)
