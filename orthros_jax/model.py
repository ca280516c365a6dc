"""OrthrosLM: the dual-stream model and its single-stream baselines in one parameter layout,
and the full-sequence (PT/SFT) driver.

An architecture (ModelConfig.architecture, a row of config/architectures.py) is a
cycle of layer kinds (ModelConfig.layer_types) and one or two streams:
  one stream   the tokens run every layer and produce the logits; attention is global causal,
               or the sliding window (ModelConfig.base_window).
  two streams  (Orthros) a base stream (sliding-window attention, writes the cache) and an
               output stream of copies that read the base stream's keys of the same layer,
               globally, and produce the logits; per-stream query scale-offsets.

The layer math lives in the layer kinds (layers/registry.py lists them; layers/kind.py says
what a kind is); this file and inference/drivers.py are drivers over their `step`, and
layers/stack.layer_loop is the one loop over layers.

Parameter tree (shapes): embedding [V, D]; final_norm [D]; lm_head [D, V] (absent when tied);
each kind's per-layer parameters stacked on a leading axis under its key, e.g. for attention
layers/attn_norm [layers, D], wq [layers, D, N, H], ... (layers/attention.py lists them).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from orthros_jax.axes import EMBED, VOCAB
from orthros_jax.config import ModelConfig
from orthros_jax.kernels.attention import check_positions_contract
from orthros_jax.layers import ffn, lora, stack
from orthros_jax.layers import primitives as nnl
from orthros_jax.layers.kind import (
    SEQUENCE,
    LayerKind,
    ParamDecl,
    Params,
    StepContext,
    Stream,
    document_starts,
    gain,
    matrix,
)
from orthros_jax.layers.registry import kinds_of

__all__ = [
    "OrthrosLM",
    "Params",
    "Stream",
    "final_hidden",
    "final_logits",
    "forward_streams",
    "gather_stream",
    "head_matrix",
    "init_params",
    "num_params",
    "param_logical_axes",
]


def forward_streams(
    params: Params,
    cfg: ModelConfig,
    base: Stream,
    out: Stream | None,
    *,
    out_index: jax.Array | None = None,
    default_positions: bool = False,
    draft_window: int | None = None,
) -> tuple[Stream, Stream | None]:
    """The full-sequence driver: every layer's step in sequence mode. base [B, T]; out: the
    output stream's copies [B, T_out] (two-stream arms) or None; out_index [B, T_out]: their
    array indices into T (None: out is a copy of every base token, aligned with it);
    draft_window: the output copies are a speculative draft's (StepContext.draft_window). The last
    two-stream layer's base stream is dead (nothing reads it) and skipped (but for paired MoE
    routing). Returns the final (base, out); with MoE layers and base.moe_stats set, base's
    moe_stats holds the router statistics summed over the layers."""
    ctx = StepContext(
        mode=SEQUENCE,
        impl=cfg.attention_impl,
        reset=document_starts(base),
        out_index=out_index,
        default_positions=default_positions,
        draft_window=draft_window,
    )

    def body(streams, kind: LayerKind, p: Params, li, compute_base: bool = True):
        b, o, _ = kind.step(p, cfg, streams[0], streams[1], None, li, ctx, compute_base)
        return b, o

    # Paired MoE routing reads the base tokens' experts, so the last layer runs the base too.
    last_base = cfg.moe_routing == "paired"

    def last(streams, kind, p, li):
        run = lambda s, k, p, li: body(s, k, p, li, last_base)
        return stack.remat(run, cfg)(streams, kind, p, li)

    return stack.layer_loop(
        params,
        cfg,
        (base, out),
        stack.remat(body, cfg),
        by_index=False,
        last=last if cfg.two_streams else None,
    )


class OrthrosLM(nn.Module):
    """The language model. See the module docstring for the parameter tree."""

    cfg: ModelConfig

    def setup(self) -> None:
        cfg, top = self.cfg, top_params(self.cfg)

        def param(name: str) -> jax.Array:  # in this order: the init keys follow it
            d = top[name]
            init = nn.with_logical_partitioning(d.init, d.axes)
            return self.param(name, init, d.shape, cfg.jnp_param_dtype)

        self.embedding = param("embedding")
        for kind in kinds_of(cfg):  # the attribute name is the params key
            setattr(self, kind.params_key, stack.KindStack(cfg, kind.name))
        for f in ffn.ffns_of(cfg):  # MoE configs: each FFN choice's stack (layers/ffn.py)
            setattr(self, f.params_key, stack.FFNStack(cfg, f.name))
        self.final_norm = param("final_norm")
        if not cfg.tie_embeddings:
            self.lm_head = param("lm_head")

    def embed(self, tokens: jax.Array) -> jax.Array:
        """Token ids [B, L] -> embeddings [B, L, D] in the activation dtype."""
        return nnl.embed(tokens, self.embedding, self.cfg.jnp_dtype)

    def head(self, x: jax.Array) -> jax.Array:
        """Final norm + LM head: [B, L, D] -> float32 logits [B, L, V]."""
        parts = {"embedding": self.embedding, "final_norm": self.final_norm}
        if not self.cfg.tie_embeddings:
            parts["lm_head"] = self.lm_head
        return final_logits(parts, x, self.cfg)

    def layer_params(self) -> Params:
        """Every kind's and FFN choice's parameter stack, under its params_key."""
        stacks = [*kinds_of(self.cfg), *ffn.ffns_of(self.cfg)]
        return {k.params_key: getattr(self, k.params_key)() for k in stacks}

    def __call__(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        output_positions: jax.Array | None = None,
        draft_window: int | None = None,
    ) -> jax.Array:
        """Full-sequence forward.

        tokens [B, T]; positions/segment_ids [B, T] (default arange / ones);
        output_positions [B, T_out] int array indices into T where a token is predicted
        (default: every position, the PT mode). draft_window: the output stream of a
        self-speculative draft instead (each copy reads its last draft_window keys, with the
        draft scale-offsets if any; PT mode only), what configs/draft_so.py distils. Returns
        float32 logits [B, T_out, V]. With MoE layers the router statistics are sown (see
        features).
        """
        x = self.features(
            tokens,
            positions=positions,
            segment_ids=segment_ids,
            output_positions=output_positions,
            draft_window=draft_window,
        )
        return self.head(x)

    def features(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        output_positions: jax.Array | None = None,
        draft_window: int | None = None,
    ) -> jax.Array:
        """The forward without the final norm and LM head (arguments as __call__): the
        predicting stream's last hidden states [B, T_out, D], for a loss that computes the
        logits in chunks (training/losses.py; model.apply(..., method="features")). With MoE
        layers the router statistics summed over the layers and both streams' tokens
        (kernels/moe.router_stats) are sown as intermediates "moe_stats" (training/losses.py)."""
        bsz, t = tokens.shape
        default_positions = positions is None and segment_ids is None
        if positions is not None:  # while still concrete: the layer scan traces them
            check_positions_contract(positions, segment_ids)
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (bsz, t))
        if segment_ids is None:
            segment_ids = jnp.ones((bsz, t), jnp.int32)
        base = Stream(
            self.embed(tokens), positions.astype(jnp.int32), segment_ids.astype(jnp.int32)
        )
        out = out_index = None
        if self.cfg.two_streams:
            out = base
        base = base.replace(moe_stats=ffn.empty_stats(self.cfg))
        if self.cfg.two_streams:
            if output_positions is not None:
                out_index = output_positions.astype(jnp.int32)
                out = gather_stream(base, out_index)
        base, out = forward_streams(
            self.layer_params(),
            self.cfg,
            base,
            out,
            out_index=out_index,
            default_positions=default_positions,
            draft_window=draft_window,
        )
        if base.moe_stats is not None:
            self.sow("intermediates", "moe_stats", base.moe_stats)
        final = out if self.cfg.two_streams else base
        if not self.cfg.two_streams and output_positions is not None:
            final = gather_stream(final, output_positions)
        return final.x


def top_params(cfg: ModelConfig) -> dict[str, ParamDecl]:
    """The model's parameters outside the layers: the embedding (not weight-decayed: decay on a
    lookup table only shrinks the rows of tokens seen in a batch; tied, it is also the head),
    the final norm and an untied lm_head (decayed)."""
    d, v, std = cfg.d_model, cfg.vocab_size, cfg.init_std
    decls = {
        "embedding": ParamDecl((v, d), (VOCAB, EMBED), False, nn.initializers.normal(std)),
        "final_norm": gain((d,), (EMBED,), cfg),
    }
    if not cfg.tie_embeddings:
        decls["lm_head"] = matrix((d, v), (EMBED, VOCAB), std)
    return decls


def param_decls(cfg: ModelConfig) -> dict[str, Any]:
    """The declaration (kind.ParamDecl) of every parameter of OrthrosLM(cfg), as its tree:
    top_params and each kind's and FFN choice's per-layer ones under its params_key (without
    the layers axis)."""
    kinds = {k.params_key: lora.with_adapters(k.params(cfg), cfg) for k in kinds_of(cfg)}
    decls = top_params(cfg) | kinds
    return decls | {f.params_key: f.params(cfg) for f in ffn.ffns_of(cfg)}


def final_logits(params: Params, x_BLD: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Final norm + LM head (the embedding's transpose when tied): [B, L, D] -> float32
    logits [B, L, V]. params: the model's tree (embedding, final_norm, lm_head)."""
    return nnl.lm_logits(final_hidden(params, x_BLD, cfg), head_matrix(params, cfg))


def final_hidden(params: Params, x_BLD: jax.Array, cfg: ModelConfig) -> jax.Array:
    """The final norm: the last hidden states [B, L, D] the LM head multiplies (x's dtype)."""
    return nnl.rms_norm(x_BLD, params["final_norm"], cfg.norm_eps, cfg.norm_zero_centered)


def head_matrix(params: Params, cfg: ModelConfig) -> jax.Array:
    """The LM head [D, V]: lm_head, or the embedding's transpose when tied."""
    return params["embedding"].T if cfg.tie_embeddings else params["lm_head"]


def num_params(cfg: ModelConfig, active: bool = False) -> int:
    """Parameter count of OrthrosLM(cfg) (embeddings and head included), summed over the layer
    kinds' and FFN choices' declared parameters; active=True counts the parameters one token
    uses (a MoE layer's router, k experts and shared expert; the rest as in the total)."""
    d, v = cfg.d_model, cfg.vocab_size
    layers = sum(k.num_params(cfg) * cfg.layers_of(k.name) for k in kinds_of(cfg))
    layers += ffn.num_params(cfg, active)
    return v * d + layers + d + (0 if cfg.tie_embeddings else d * v)


def gather_stream(stream: Stream, index_BT: jax.Array) -> Stream:
    """The tokens of a stream at array indices [B, T_out] (output copies keep their positions)."""
    idx = index_BT.astype(jnp.int32)
    take = jax.vmap(lambda a, i: jnp.take(a, i, axis=0))
    return Stream(take(stream.x, idx), take(stream.positions, idx), take(stream.segment_ids, idx))


@functools.partial(jax.jit, static_argnums=0)
def init_params(cfg: ModelConfig, rng: jax.Array) -> Params:
    """Unboxed parameters of OrthrosLM(cfg). Jitted with cfg static: flax's init traces a
    one-token forward, which run eagerly is one dispatch (and one compile) per op."""
    model = OrthrosLM(cfg)
    tokens = jnp.zeros((1, 1), jnp.int32)
    return nn.unbox(model.init(rng, tokens)["params"])


def param_logical_axes(cfg: ModelConfig) -> Any:
    """The logical axis names of every parameter, as a PartitionSpec pytree."""
    abstract = jax.eval_shape(
        lambda: OrthrosLM(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32))
    )["params"]
    return nn.get_partition_spec(abstract)
