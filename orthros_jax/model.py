"""OrthrosLM: the dual-stream model and its single-stream baselines in one parameter layout.

Architectures (ModelConfig.architecture):
  orthros      base stream (sliding window, writes K/V) + output stream (global over the
               base K/V of the same layer, produces the logits); per-stream query scale-offset.
  transformer  one stream, global causal attention.
  swa          one stream, sliding-window attention.

The layer math is written as pure functions over one layer's parameter dict so that the
training forward (`OrthrosLM.__call__`) and the cached inference paths (inference.py) compose
the same pieces: `layer_kv`, `layer_query`, `layer_finish`. Parameters of all layers are
stacked on a leading axis L, so the layer loop is a `lax.scan` (or a Python loop).

Parameter tree (shapes):
  embedding [V, D]; final_norm [D]; lm_head [D, V] (absent when tied)
  layers/attn_norm [L, D], mlp_norm [L, D], wq [L, D, N, H], wk/wv [L, D, K, H],
  wo [L, N, H, D], w_gate/w_up [L, D, F], w_down [L, F, D], q_norm/k_norm [L, H] (qk_norm),
  so_{base,out}_{scale,offset} [L, N, H] (orthros with scale_offset)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from orthros_jax import layers as L
from orthros_jax.attention import global_attention, local_attention
from orthros_jax.config import ModelConfig

# Logical axis names; sharding.py maps them to mesh axes.
LAYERS, VOCAB, EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP = (
    "layers",
    "vocab",
    "embed",
    "heads",
    "kv_heads",
    "head_dim",
    "mlp",
)
Params = dict[str, Any]
# attend(q [B, Lq, N, H], k [B, Lk, K, H], v) -> [B, Lq, N, H]
AttendFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


@flax.struct.dataclass
class Stream:
    """One token stream: activations and the original positions/segments of its tokens."""

    x: jax.Array  # [B, L, D]
    positions: jax.Array  # [B, L] int32, original positions (output copies keep their token's)
    segment_ids: jax.Array  # [B, L] int32, document id (packing); 0 = padding by convention


def layer_param_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Shape and logical axes of every per-layer parameter (without the leading L axis)."""
    d, n, k, h, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    shapes = {
        "attn_norm": ((d,), (EMBED,)),
        "wq": ((d, n, h), (EMBED, HEADS, HEAD_DIM)),
        "wk": ((d, k, h), (EMBED, KV_HEADS, HEAD_DIM)),
        "wv": ((d, k, h), (EMBED, KV_HEADS, HEAD_DIM)),
        "wo": ((n, h, d), (HEADS, HEAD_DIM, EMBED)),
        "mlp_norm": ((d,), (EMBED,)),
        "w_gate": ((d, f), (EMBED, MLP)),
        "w_up": ((d, f), (EMBED, MLP)),
        "w_down": ((f, d), (MLP, EMBED)),
    }
    if cfg.qk_norm:
        shapes["q_norm"] = ((h,), (HEAD_DIM,))
        shapes["k_norm"] = ((h,), (HEAD_DIM,))
    if cfg.two_streams and cfg.scale_offset:
        for stream in ("base", "out"):
            shapes[f"so_{stream}_scale"] = ((n, h), (HEADS, HEAD_DIM))
            shapes[f"so_{stream}_offset"] = ((n, h), (HEADS, HEAD_DIM))
    return shapes


def _init_for(name: str, cfg: ModelConfig) -> Callable[..., jax.Array]:
    if name.endswith("norm") or name.endswith("_scale"):
        return nn.initializers.ones
    if name.endswith("_offset"):
        return nn.initializers.zeros
    std = cfg.init_std
    if name in ("wo", "w_down"):  # residual-branch outputs, GPT-2 style depth scaling
        std = std / (2 * cfg.n_layers) ** 0.5
    return nn.initializers.normal(std)


class LayerStack(nn.Module):
    """Holds the stacked per-layer parameters; calling it returns them as a dict."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self) -> Params:
        cfg = self.cfg
        out = {}
        for name, (shape, axes) in layer_param_shapes(cfg).items():
            init = nn.with_logical_partitioning(_init_for(name, cfg), (LAYERS, *axes))
            out[name] = self.param(name, init, (cfg.n_layers, *shape), cfg.jnp_param_dtype)
        return out


# ---------------------------------------------------------------- per-layer pure functions


def layer_kv(p: Params, x: jax.Array, positions: jax.Array, cfg: ModelConfig):
    """K/V of a layer from its base input x [B, L, D]: k (rotated), v [B, L, K, H]."""
    h = L.rms_norm(x, p["attn_norm"], cfg.norm_eps)
    k = jnp.einsum("bld,dkh->blkh", h, p["wk"].astype(h.dtype))
    v = jnp.einsum("bld,dkh->blkh", h, p["wv"].astype(h.dtype))
    if cfg.qk_norm:
        k = L.rms_norm(k, p["k_norm"], cfg.norm_eps)
    return L.apply_rope(k, positions, L.rope_inv_freq(cfg)), v


def layer_query(p: Params, x: jax.Array, positions: jax.Array, cfg: ModelConfig, stream: str):
    """Queries [B, L, N, H] of a stream ('base' or 'out'): q = alpha*(x Wq)+beta, then RoPE."""
    h = L.rms_norm(x, p["attn_norm"], cfg.norm_eps)
    q = jnp.einsum("bld,dnh->blnh", h, p["wq"].astype(h.dtype))
    if cfg.qk_norm:
        q = L.rms_norm(q, p["q_norm"], cfg.norm_eps)
    if cfg.two_streams and cfg.scale_offset:
        q = q * p[f"so_{stream}_scale"].astype(q.dtype) + p[f"so_{stream}_offset"].astype(q.dtype)
    return L.apply_rope(q, positions, L.rope_inv_freq(cfg))


def layer_finish(p: Params, x: jax.Array, attn: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Shared W_O + residual, then the SwiGLU FFN + residual. attn: [B, L, N, H]."""
    x = x + jnp.einsum("blnh,nhd->bld", attn, p["wo"].astype(attn.dtype))
    h = L.rms_norm(x, p["mlp_norm"], cfg.norm_eps)
    return x + L.swiglu(h, p["w_gate"], p["w_up"], p["w_down"])


def block(
    p: Params,
    cfg: ModelConfig,
    base: Stream,
    out: Stream | None,
    *,
    attend_base: AttendFn,
    attend_out: AttendFn | None,
    compute_base: bool = True,
) -> tuple[Stream, Stream | None, tuple[jax.Array, jax.Array]]:
    """One layer for both streams. K/V come from the base stream only; the output stream
    reads them and writes nothing. With compute_base=False (the last orthros layer) the base
    stream's attention and FFN, which nothing reads, are skipped. Returns (base, out, (k, v))."""
    k, v = layer_kv(p, base.x, base.positions, cfg)
    if compute_base:
        q = layer_query(p, base.x, base.positions, cfg, "base")
        base = base.replace(x=layer_finish(p, base.x, attend_base(q, k, v), cfg))
    if out is not None:
        q_out = layer_query(p, out.x, out.positions, cfg, "out")
        out = out.replace(x=layer_finish(p, out.x, attend_out(q_out, k, v), cfg))
    return base, out, (k, v)


def training_attention(cfg: ModelConfig, base: Stream, out: Stream | None):
    """Attention closures for a full-sequence forward (PT/SFT): (attend_base, attend_out)."""

    def local(q, k, v):
        return local_attention(
            q,
            k,
            v,
            q_positions=base.positions,
            k_positions=base.positions,
            window=cfg.window,
            q_segment_ids=base.segment_ids,
            k_segment_ids=base.segment_ids,
            block_size=cfg.attention_block_local,
        )

    def global_from(queries: Stream) -> AttendFn:
        def attend(q, k, v):
            return global_attention(
                q,
                k,
                v,
                q_positions=queries.positions,
                k_positions=base.positions,
                q_segment_ids=queries.segment_ids,
                k_segment_ids=base.segment_ids,
                block_q=cfg.attention_block_q,
                block_k=cfg.attention_block_k,
            )

        return attend

    if cfg.architecture == "orthros":
        return local, global_from(out)
    if cfg.architecture == "swa":
        return local, None
    return global_from(base), None


def _remat(fn: Callable, cfg: ModelConfig) -> Callable:
    if cfg.remat == "none":
        return fn
    policy = (
        None if cfg.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    )
    return jax.checkpoint(fn, policy=policy)


def run_layers(
    layer_params: Params, cfg: ModelConfig, base: Stream, out: Stream | None
) -> tuple[Stream, Stream | None]:
    """Applies all layers (full-sequence forward). Returns the final (base, out) streams."""
    n = cfg.n_layers
    attend_base, attend_out = training_attention(cfg, base, out)
    skip_last_base = cfg.two_streams

    def step(streams, p, compute_base: bool = True):
        b, o = streams
        b, o, _ = block(
            p, cfg, b, o, attend_base=attend_base, attend_out=attend_out, compute_base=compute_base
        )
        return b, o

    body = _remat(step, cfg)
    head = n - 1 if skip_last_base else n
    streams = (base, out)
    if cfg.scan_layers and head > 0:
        first = jax.tree.map(lambda a: a[:head], layer_params)
        streams, _ = jax.lax.scan(lambda s, p: (body(s, p), None), streams, first)
    else:
        for i in range(head):
            streams = body(streams, jax.tree.map(lambda a, i=i: a[i], layer_params))
    if skip_last_base:
        last = jax.tree.map(lambda a: a[n - 1], layer_params)
        streams = _remat(lambda s, p: step(s, p, compute_base=False), cfg)(streams, last)
    return streams


class OrthrosLM(nn.Module):
    """The language model. See the module docstring for the parameter tree."""

    cfg: ModelConfig

    def setup(self) -> None:
        cfg = self.cfg
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), (VOCAB, EMBED)),
            (cfg.vocab_size, cfg.d_model),
            cfg.jnp_param_dtype,
        )
        self.layers = LayerStack(cfg, name="layers")
        self.final_norm = self.param(
            "final_norm",
            nn.with_logical_partitioning(nn.initializers.ones, (EMBED,)),
            (cfg.d_model,),
            cfg.jnp_param_dtype,
        )
        if not cfg.tie_embeddings:
            self.lm_head = self.param(
                "lm_head",
                nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), (EMBED, VOCAB)),
                (cfg.d_model, cfg.vocab_size),
                cfg.jnp_param_dtype,
            )

    def embed(self, tokens: jax.Array) -> jax.Array:
        """Token ids [B, L] -> embeddings [B, L, D] in the activation dtype."""
        return L.embed(tokens, self.embedding, self.cfg.jnp_dtype)

    def head(self, x: jax.Array) -> jax.Array:
        """Final norm + LM head: [B, L, D] -> float32 logits [B, L, V]."""
        head = self.embedding.T if self.cfg.tie_embeddings else self.lm_head
        return L.lm_logits(L.rms_norm(x, self.final_norm, self.cfg.norm_eps), head)

    def layer_params(self) -> Params:
        return self.layers()

    def __call__(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        output_positions: jax.Array | None = None,
    ) -> jax.Array:
        """Full-sequence forward.

        tokens [B, T]; positions/segment_ids [B, T] (default arange / ones);
        output_positions [B, T_out] int array indices into T where a token is predicted
        (default: every position, the PT mode). Returns float32 logits [B, T_out, V].
        """
        bsz, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (bsz, t))
        if segment_ids is None:
            segment_ids = jnp.ones((bsz, t), jnp.int32)
        base = Stream(
            self.embed(tokens), positions.astype(jnp.int32), segment_ids.astype(jnp.int32)
        )
        out = None
        if self.cfg.two_streams:
            out = base if output_positions is None else gather_stream(base, output_positions)
        base, out = run_layers(self.layer_params(), self.cfg, base, out)
        final = out if self.cfg.two_streams else base
        if not self.cfg.two_streams and output_positions is not None:
            final = gather_stream(final, output_positions)
        return self.head(final.x)


def gather_stream(stream: Stream, index_BT: jax.Array) -> Stream:
    """The tokens of a stream at array indices [B, T_out] (output copies keep their positions)."""
    idx = index_BT.astype(jnp.int32)
    take = jax.vmap(lambda a, i: jnp.take(a, i, axis=0))
    return Stream(take(stream.x, idx), take(stream.positions, idx), take(stream.segment_ids, idx))


def init_params(cfg: ModelConfig, rng: jax.Array) -> Params:
    """Unboxed parameters of OrthrosLM(cfg), without running a forward pass."""
    model = OrthrosLM(cfg)
    tokens = jnp.zeros((1, 1), jnp.int32)
    return nn.unbox(model.init(rng, tokens)["params"])


def param_logical_axes(cfg: ModelConfig) -> Any:
    """The logical axis names of every parameter, as a PartitionSpec pytree."""
    abstract = jax.eval_shape(
        lambda: OrthrosLM(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))
    )["params"]
    return nn.get_partition_spec(abstract)
