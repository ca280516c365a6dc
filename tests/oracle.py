"""An independent float64 NumPy reference of the Orthros equations (../shared/PAPER.md).

It imports nothing from `orthros_jax`: it reads the model's parameter tree as nested dicts of
arrays (`to_float64` copies them) and a `Spec` read from a config by attribute name. It runs
one sequence at a time with dense [L_q, L_k] masks, no cache, no blocking, no chunks: prefill
and decode are, by the paper's definition, the forward with the output stream at one token.

Where each fact comes from:
  PAPER.md (Sec. 3.1, Eqs. 4-5, Alg. 1)
    two streams sharing every weight; per-stream query scale-offset q = alpha * (x W_Q) + beta;
    K/V of a layer from that layer's base input after the attention norm, never from the
    output stream; base query attends the w keys j in [t - w + 1, t]; output query attends
    every key j <= t; scores q k^T / sqrt(H); shared W_O, residual, norm and FFN with a
    residual path per stream; the output copy starts as the token's embedding at the token's
    original position; masks use original positions, never array indices; only the output
    stream produces logits.
  The project's brief (issue 11 item 4) and DESIGN.md
    pre-RMSNorm `scale * x / sqrt(mean(x^2) + eps)` over the last axis; RoPE in the Hugging
    Face rotate-half layout (pairs (i, i + H/2), inv_freq = theta^(-2i/H), default type only);
    q/k RMSNorm over head_dim after the projection, before SO and RoPE; SO before RoPE;
    keys visible only inside the same segment (packed documents); SwiGLU
    `down(silu(x W_gate) * (x W_up))`; final norm then LM head; `transformer` = one stream with
    global causal attention, `swa` = one stream with window attention, neither has SO.
  The code, where both are silent (checked in orthros_jax, not imported)
    GQA: query head n reads kv head n // G (G = N / K, HF `repeat_kv`; attention.py);
    embeddings are not scaled (layers.embed); the tied head is embedding^T (model.head);
    no biases anywhere; the single-stream arms' logits come from their one stream.

Extending: a layer kind is one function `(p, spec, base, out) -> (base, out)` registered in
`KINDS` under its name with the key of its parameter stack and the names it reads;
`Spec.layer_kinds` names the kind of every layer (the model's `layer_types` cycle, repeated),
and layer i reads entry r of its kind's stack, r = how many earlier layers share its kind.
The gated DeltaNet kind ("gdn", oracle_gdn.py) is registered at the end of this file.
Shapes: L a sequence axis, T tokens, D d_model, N query heads, K kv heads, H head_dim, F d_ff,
V vocab.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

Params = Mapping[str, Any]
ARCHITECTURES = ("orthros", "transformer", "swa", "gdn", "hybrid", "orthros_h", "gla", "retnet")
TWO_STREAMS = ("orthros", "orthros_h")


@dataclasses.dataclass(frozen=True)
class Spec:
    """What fixes the math (not the shapes, which come from the parameters)."""

    architecture: str
    window: int
    norm_eps: float
    rope_theta: float
    qk_norm: bool
    tie_embeddings: bool
    scale_offset: bool
    layer_kinds: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"oracle: architecture {self.architecture!r} is unknown; allowed: {ARCHITECTURES}"
            )
        if self.scale_offset and not self.two_streams:
            raise ValueError(f"oracle: scale_offset needs architecture in {TWO_STREAMS}")

    @property
    def two_streams(self) -> bool:
        return self.architecture in TWO_STREAMS

    @classmethod
    def from_config(cls, cfg: Any) -> Spec:
        """Reads a model config by attribute name; `layer_types` (default: attention only) is a
        cycle repeated over the n_layers layers."""
        rope_type = getattr(cfg, "rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"oracle: rope_type {rope_type!r} is not modelled; use 'default'")
        cycle = tuple(getattr(cfg, "layer_types", ("attention",)))
        return cls(
            architecture=cfg.architecture,
            window=cfg.window,
            norm_eps=cfg.norm_eps,
            rope_theta=cfg.rope_theta,
            qk_norm=cfg.qk_norm,
            tie_embeddings=cfg.tie_embeddings,
            scale_offset=cfg.scale_offset,
            layer_kinds=tuple(cycle[i % len(cycle)] for i in range(cfg.n_layers)),
        )


def to_float64(tree: Any) -> Any:
    """A float64 NumPy copy of a nested dict of arrays (the model's parameter tree)."""
    if isinstance(tree, Mapping):
        return {name: to_float64(value) for name, value in tree.items()}
    return np.array(tree, dtype=np.float64)


@dataclasses.dataclass(frozen=True)
class Stream:
    """One token stream of one sequence: activations and its tokens' original coordinates."""

    x: np.ndarray  # [L, D]
    positions: np.ndarray  # [L] original positions (an output copy keeps its token's)
    segments: np.ndarray  # [L] document ids; keys are visible only within a document


# ---------------------------------------------------------------- one function per equation


def rms_norm(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    """scale * x / sqrt(mean(x^2) + eps) over the last axis. x [..., E], scale [E]."""
    return scale * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x_LNH: np.ndarray, positions_L: np.ndarray, theta: float) -> np.ndarray:
    """Rotates each pair (i, i + H/2) of every head by angle position * theta^(-2i/H)."""
    half = x_LNH.shape[-1] // 2
    inv_freq = theta ** (-2.0 * np.arange(half) / x_LNH.shape[-1])  # [H/2]
    angle = positions_L.astype(np.float64)[:, None, None] * inv_freq  # [L, 1, H/2]
    first, second = x_LNH[..., :half], x_LNH[..., half:]
    cos, sin = np.cos(angle), np.sin(angle)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def visible(queries: Stream, keys: Stream, window: int | None) -> np.ndarray:
    """[L_q, L_k] mask: same segment, key position <= query position, and within the last
    `window` positions (the query's own included) when a window is given."""
    qp, kp = queries.positions[:, None], keys.positions[None, :]
    mask = (kp <= qp) & (queries.segments[:, None] == keys.segments[None, :])
    if window is not None:
        mask &= kp > qp - window
    return mask


def attend(q_LNH: np.ndarray, k_LKH: np.ndarray, v_LKH: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(H)) v over the visible keys; query head n reads kv head n // G."""
    n_heads, n_kv, head_dim = q_LNH.shape[1], k_LKH.shape[1], q_LNH.shape[2]
    if not mask.any(axis=1).all():
        raise ValueError("oracle: a query sees no key (its own token must be among the keys)")
    out = np.empty_like(q_LNH)
    for n in range(n_heads):
        kv = n // (n_heads // n_kv)
        scores = q_LNH[:, n] @ k_LKH[:, kv].T / np.sqrt(head_dim)  # [L_q, L_k]
        scores = np.where(mask, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, n] = (weights / weights.sum(axis=1, keepdims=True)) @ v_LKH[:, kv]
    return out


def swiglu(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """down(silu(x W_gate) * (x W_up)) with silu(z) = z / (1 + e^-z). x [L, D] -> [L, D]."""
    gate = x @ w_gate
    return (gate / (1.0 + np.exp(-gate)) * (x @ w_up)) @ w_down


def keys_values(p: Params, base: Stream, spec: Spec) -> tuple[np.ndarray, np.ndarray]:
    """k = RoPE(k_norm(x W_K)), v = x W_V from the base input x after the attention norm.
    Returns k, v [L, K, H]."""
    h = rms_norm(base.x, p["attn_norm"], spec.norm_eps)
    k = np.einsum("ld,dkh->lkh", h, p["wk"])
    v = np.einsum("ld,dkh->lkh", h, p["wv"])
    if spec.qk_norm:
        k = rms_norm(k, p["k_norm"], spec.norm_eps)
    return rope(k, base.positions, spec.rope_theta), v


def queries(p: Params, stream: Stream, spec: Spec, name: str) -> np.ndarray:
    """q = RoPE(alpha * q_norm(x W_Q) + beta) of stream `name` ('base' | 'out'). [L, N, H]."""
    h = rms_norm(stream.x, p["attn_norm"], spec.norm_eps)
    q = np.einsum("ld,dnh->lnh", h, p["wq"])
    if spec.qk_norm:
        q = rms_norm(q, p["q_norm"], spec.norm_eps)
    if spec.scale_offset:
        q = p[f"so_{name}_scale"] * q + p[f"so_{name}_offset"]
    return rope(q, stream.positions, spec.rope_theta)


def finish(p: Params, x: np.ndarray, attn_LNH: np.ndarray, spec: Spec) -> np.ndarray:
    """x + attn W_O, then + SwiGLU(mlp_norm(.)): the residual path of one stream. [L, D]."""
    x = x + np.einsum("lnh,nhd->ld", attn_LNH, p["wo"])
    h = rms_norm(x, p["mlp_norm"], spec.norm_eps)
    return x + swiglu(h, p["w_gate"], p["w_up"], p["w_down"])


QueryFn = Callable[[Params, Stream, Spec, str], np.ndarray]


def attention_layer(
    p: Params, spec: Spec, base: Stream, out: Stream | None, *, query_fn: QueryFn = queries
) -> tuple[Stream, Stream | None]:
    """One attention layer. The base stream attends its window (the whole causal past for
    `transformer`); the output stream attends every base key up to its own position. Both
    read the K/V of this layer's base input; the output stream writes none."""
    k, v = keys_values(p, base, spec)
    # The Linear Hybrid's attention layers are full causal attention, like the Transformer's.
    base_window = None if spec.architecture in ("transformer", "hybrid") else spec.window
    attn = attend(query_fn(p, base, spec, "base"), k, v, visible(base, base, base_window))
    new_base = dataclasses.replace(base, x=finish(p, base.x, attn, spec))
    if out is None:
        return new_base, None
    attn_out = attend(query_fn(p, out, spec, "out"), k, v, visible(out, base, None))
    return new_base, dataclasses.replace(out, x=finish(p, out.x, attn_out, spec))


def attention_param_names(spec: Spec) -> set[str]:
    """The per-layer parameter names an attention layer reads."""
    names = {"attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"}
    if spec.qk_norm:
        names |= {"q_norm", "k_norm"}
    if spec.scale_offset:
        names |= {f"so_{s}_{a}" for s in ("base", "out") for a in ("scale", "offset")}
    return names


LayerFn = Callable[[Params, Spec, Stream, "Stream | None"], tuple[Stream, "Stream | None"]]


@dataclasses.dataclass(frozen=True)
class Kind:
    """A layer kind: its step, the top-level key of its parameter stack, the names it reads."""

    layer: LayerFn
    params_key: str
    param_names: Callable[[Spec], set[str]]


KINDS: dict[str, Kind] = {"attention": Kind(attention_layer, "layers", attention_param_names)}


def check_params(params: Params, spec: Spec, kinds: Mapping[str, Kind] = KINDS) -> None:
    """Raises ValueError unless the tree holds exactly the arrays the equations read."""
    used = list(dict.fromkeys(spec.layer_kinds))
    unknown = [k for k in used if k not in kinds]
    if unknown:
        raise ValueError(f"oracle: layer kinds {unknown} unknown; known: {sorted(kinds)}")
    top = {"embedding", "final_norm"} | {kinds[k].params_key for k in used}
    top |= set() if spec.tie_embeddings else {"lm_head"}
    if set(params) != top:
        raise ValueError(f"oracle: top-level params {sorted(params)}; expected {sorted(top)}")
    for k in used:
        stack, want = params[kinds[k].params_key], kinds[k].param_names(spec)
        if set(stack) != want:
            raise ValueError(f"oracle: {k} layer params {sorted(stack)}; expected {sorted(want)}")
        depths = {np.shape(a)[0] for a in stack.values()}
        if depths != {spec.layer_kinds.count(k)}:
            raise ValueError(
                f"oracle: {k} stacks of depth {depths}; layer_kinds {spec.layer_kinds} has "
                f"{spec.layer_kinds.count(k)}"
            )


def layer_params(
    params: Params, spec: Spec, index: int, kinds: Mapping[str, Kind] = KINDS
) -> dict[str, np.ndarray]:
    """Layer `index`'s parameters: each kind's layers are stacked in order under its key."""
    kind = spec.layer_kinds[index]
    rank = spec.layer_kinds[:index].count(kind)
    return {name: stack[rank] for name, stack in params[kinds[kind].params_key].items()}


def run_layers(
    params: Params,
    spec: Spec,
    base: Stream,
    out: Stream | None,
    kinds: Mapping[str, Kind] = KINDS,
) -> tuple[Stream, Stream | None]:
    """Applies every layer in order, dispatching on its kind name."""
    for index, kind in enumerate(spec.layer_kinds):
        p = layer_params(params, spec, index, kinds)
        base, out = kinds[kind].layer(p, spec, base, out)
    return base, out


def lm_head(params: Params, x_LD: np.ndarray, spec: Spec) -> np.ndarray:
    """Final norm, then the LM head (embedding^T when tied). [L, D] -> logits [L, V]."""
    head = params["embedding"].T if spec.tie_embeddings else params["lm_head"]
    return rms_norm(x_LD, params["final_norm"], spec.norm_eps) @ head


def forward(
    params: Params,
    spec: Spec,
    tokens: np.ndarray,
    *,
    positions: np.ndarray | None = None,
    segments: np.ndarray | None = None,
    output_index: np.ndarray | None = None,
    kinds: Mapping[str, Kind] = KINDS,
) -> np.ndarray:
    """Logits [T_out, V] of one sequence tokens [T] at the array indices output_index [T_out]
    (default: every token, PT). positions/segments [T] default to arange(T) / one document."""
    check_params(params, spec, kinds)
    t = len(tokens)
    positions = np.arange(t) if positions is None else np.asarray(positions)
    segments = np.ones(t, np.int64) if segments is None else np.asarray(segments)
    index = np.arange(t) if output_index is None else np.asarray(output_index)
    base = Stream(params["embedding"][np.asarray(tokens)], positions, segments)
    # The output copies start from the token embeddings at their tokens' original positions.
    out = Stream(base.x[index], positions[index], segments[index]) if spec.two_streams else None
    base, out = run_layers(params, spec, base, out, kinds)
    final = out.x if spec.two_streams else base.x[index]
    return lm_head(params, final, spec)


def forward_batch(
    params: Params,
    spec: Spec,
    tokens_BT: np.ndarray,
    *,
    kinds: Mapping[str, Kind] = KINDS,
    **rows: np.ndarray,
) -> np.ndarray:
    """`forward` row by row: logits [B, T_out, V]. rows: any of `forward`'s positions,
    segments, output_index, given for every row ([B, T] or [B, T_out])."""
    tokens_BT = np.asarray(tokens_BT)
    return np.stack(
        [
            forward(
                params,
                spec,
                tokens_BT[b],
                kinds=kinds,
                **{k: np.asarray(a)[b] for k, a in rows.items()},
            )
            for b in range(len(tokens_BT))
        ]
    )


def next_token_logits(
    params: Params, spec: Spec, tokens_BT: np.ndarray, lengths_B: np.ndarray
) -> np.ndarray:
    """Prefill/decode by definition: each row's first lengths[b] tokens, the output stream at
    the last of them only. Returns logits [B, V]."""
    return np.stack(
        [
            forward(params, spec, np.asarray(tokens_BT)[b, :n], output_index=np.array([n - 1]))[0]
            for b, n in enumerate(np.asarray(lengths_B))
        ]
    )


# The gated DeltaNet kind lives in its own file (it imports this module's equations).
from oracle_gdn import gdn_layer, gdn_param_names  # noqa: E402

KINDS["gdn"] = Kind(gdn_layer, "gdn_layers", gdn_param_names)
