"""LoRA adapters over the projections the layer kinds declare adaptable, as one tree transform.

A kind declares which of its projections may carry an adapter (kind.ParamDecl.adapter_in: how
many leading axes are the input side); ModelConfig.lora picks the targets among them
(layers/registry.validate checks them), rank r and alpha. A target W [*in, *out] gets two
more parameters in its kind's stack, declared here from W's declaration (so they are
initialised, sharded by the same logical-axis rules, checkpointed and restored like every
other parameter):
  {name}_lora_a [*in, r]   logical axes (*W's in axes, None); normal(1 / sqrt(prod(in)))
  {name}_lora_b [r, *out]  logical axes (None, *W's out axes); zeros (the adapter starts at 0)
and the layer computes with W + (alpha / r) A @ B (`merged_layer`, applied by
stack.layer_loop to each layer's parameters, so every driver that runs the layers (PT, SFT,
prefill, decode, the engine, RL) runs the adapted model). `merge` folds the adapters into the
base weights (export, serving); `split` / `join` separate them (peft export / import).

Why not qwix: qwix's LoRA intercepts the einsums / dot_generals of Flax modules by module
path; the kinds' steps are pure functions over parameter dicts, driven outside any Flax module
by the inference drivers, so there is nothing for it to intercept (docs/lora.md).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from orthros_jax.config import ModelConfig
from orthros_jax.layers.kind import ParamDecl, Params, Role
from orthros_jax.layers.registry import kinds_of

A_SUFFIX, B_SUFFIX = "_lora_a", "_lora_b"


def adaptable(decls: dict[str, ParamDecl]) -> list[str]:
    """The names of the declared projections that may carry an adapter."""
    return [name for name, d in decls.items() if d.adapter_in > 0]


def targets_of(decls: dict[str, ParamDecl], cfg: ModelConfig) -> list[str]:
    """The projections of `decls` that get an adapter under cfg.lora (none without it)."""
    if cfg.lora is None:
        return []
    wanted = cfg.lora.targets
    return [n for n in adaptable(decls) if not wanted or n in wanted]


def adapter_decls(decls: dict[str, ParamDecl], cfg: ModelConfig) -> dict[str, ParamDecl]:
    """The declarations of the A and B factors of every target in `decls` (module docstring)."""
    out: dict[str, ParamDecl] = {}
    if cfg.lora is None:
        return out
    r = cfg.lora.rank
    for name in targets_of(decls, cfg):
        d, k = decls[name], decls[name].adapter_in
        std = 1.0 / math.sqrt(math.prod(d.shape[:k]))
        out[name + A_SUFFIX] = ParamDecl(
            (*d.shape[:k], r), (*d.axes[:k], None), False, nn.initializers.normal(std), Role.ADAPTER
        )
        out[name + B_SUFFIX] = ParamDecl(
            (r, *d.shape[k:]), (None, *d.axes[k:]), False, nn.initializers.zeros, Role.ADAPTER
        )
    return out


def with_adapters(decls: dict[str, ParamDecl], cfg: ModelConfig) -> dict[str, ParamDecl]:
    """A kind's declarations plus those of its adapters under cfg."""
    return decls | adapter_decls(decls, cfg)


def delta(a: jax.Array, b: jax.Array) -> jax.Array:
    """A [*in, r] @ B [r, *out] -> [*in, *out] in float32."""
    return jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)


def merged_layer(p: Params, cfg: ModelConfig) -> Params:
    """One layer's parameters (no layers axis) with every adapted W replaced by
    W + (alpha / r) A @ B in W's dtype, the factors dropped; unchanged without cfg.lora."""
    if cfg.lora is None:
        return p
    out = {k: v for k, v in p.items() if not k.endswith((A_SUFFIX, B_SUFFIX))}
    for name in [k[: -len(A_SUFFIX)] for k in p if k.endswith(A_SUFFIX)]:
        w = p[name]
        d = delta(p[name + A_SUFFIX], p[name + B_SUFFIX])
        out[name] = (w.astype(jnp.float32) + cfg.lora.scale * d).astype(w.dtype)
    return out


def split(params: Params, cfg: ModelConfig) -> tuple[Params, Params]:
    """(the params without adapters, the adapters {params_key: {name: [layers, ...]}})."""
    base, adapters = dict(params), {}
    for kind in kinds_of(cfg):
        stack = params.get(kind.params_key, {})
        names = [n for n in stack if n.endswith((A_SUFFIX, B_SUFFIX))]
        if names:
            base[kind.params_key] = {n: v for n, v in stack.items() if n not in names}
            adapters[kind.params_key] = {n: stack[n] for n in names}
    return base, adapters


def join(base: Params, adapters: Params) -> Params:
    """The params with the adapters of `split` put back into their kinds' stacks."""
    out = dict(base)
    for key, stack in adapters.items():
        out[key] = {**base[key], **stack}
    return out


def merge(params: Params, cfg: ModelConfig) -> tuple[Params, ModelConfig]:
    """(params with every adapter folded into its base weight, cfg without lora): the plain
    model that computes what the adapted one does (export, merged serving). Jittable."""
    if cfg.lora is None:
        return params, cfg
    out = dict(params)
    for kind in kinds_of(cfg):
        if kind.params_key in params:
            out[kind.params_key] = jax.vmap(lambda p: merged_layer(p, cfg))(params[kind.params_key])
    return out, cfg.replace(lora=None)


def init_adapters(cfg: ModelConfig, rng: jax.Array, dtype: Any = None) -> Params:
    """Fresh adapters for every kind's stack (B = 0: the adapted model starts as the base):
    what a base checkpoint lacks when a LoRA run starts from it (init_from)."""
    out: Params = {}
    dtype = dtype or cfg.jnp_param_dtype
    for i, kind in enumerate(kinds_of(cfg)):
        decls, n = adapter_decls(kind.params(cfg), cfg), cfg.layers_of(kind.name)
        keys = jax.random.split(jax.random.fold_in(rng, i), max(len(decls), 1))
        stack = {
            name: d.init(key, (n, *d.shape), dtype)
            for key, (name, d) in zip(keys, decls.items(), strict=False)
        }
        if stack:
            out[kind.params_key] = stack
    return out


def rank_dropout(params: Params, cfg: ModelConfig, rng: jax.Array) -> Params:
    """Training's adapter dropout: each layer's A keeps each of its r rank components with
    probability 1 - dropout (scaled by 1 / (1 - dropout)), drawn afresh per step from rng."""
    if cfg.lora is None or cfg.lora.dropout == 0:
        return params
    keep = 1.0 - cfg.lora.dropout
    out = dict(params)
    for i, kind in enumerate(kinds_of(cfg)):
        stack = dict(params[kind.params_key])
        for j, name in enumerate(n for n in sorted(stack) if n.endswith(A_SUFFIX)):
            a = stack[name]  # [layers, *in, r]
            key = jax.random.fold_in(jax.random.fold_in(rng, i), j)
            shape = (a.shape[0],) + (1,) * (a.ndim - 2) + (a.shape[-1],)
            mask = jax.random.bernoulli(key, keep, shape).astype(a.dtype) / keep
            stack[name] = a * mask
        out[kind.params_key] = stack
    return out
