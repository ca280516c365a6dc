"""The layer stack: which kind each layer is, its parameters, and the one loop over layers.

A stack is `cfg.n_cycles` repetitions of the cycle `cfg.layer_types` (e.g. three gated
DeltaNet layers then one attention layer). Each kind's parameters are stacked on a leading
axis over the layers of that kind, under the kind's `params_key` ("layers" for attention, so
uniform stacks keep the historic layout). Layer j of cycle c is entry cfg.layer_index(c, j) of
its kind's stack (cfg.layer_slots() lists every layer's). `layer_loop` is the only loop over
layers: a scan over cycles (reading parameters as scanned xs for the training forward, or by
dynamic index out of the whole stack for the cached modes: docs/performance.md, "One layer
loop that reads layers by index"), unrolled with cfg.scan_layers=False. `fill_identity_so`
adds the scale-offset vectors a single-stream checkpoint lacks, for every kind.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

import flax.linen as nn
import jax
import numpy as np

from orthros_jax.axes import LAYERS
from orthros_jax.config import ModelConfig
from orthros_jax.layers import lora
from orthros_jax.layers.ffn import FFNS, ffns_of
from orthros_jax.layers.kind import LayerIndex, LayerKind, ParamDecl, Params
from orthros_jax.layers.registry import KINDS, kinds_of

__all__ = [
    "KINDS",
    "FFNStack",
    "KindStack",
    "fill_identity_so",
    "kinds_of",
    "layer_loop",
    "remat",
    "so_names",
    "drop_draft_so",
]


def so_names(kind: LayerKind, cfg: ModelConfig) -> tuple[str, ...]:
    """The kind's scale-offset parameters under cfg: the names its params has only with
    scale_offset (none for a single-stream arm or scale_offset=False)."""
    plain = kind.params(cfg.replace(scale_offset=False, draft_scale_offset=False))
    return tuple(name for name in kind.params(cfg) if name not in plain)


def fill_identity_so(params: Params, cfg: ModelConfig) -> tuple[Params, list[str]]:
    """params with every scale-offset vector of cfg's layers that it lacks added as the
    identity: scale 1, offset 0, [layers of the kind, *shape] in cfg.param_dtype, or a copy of
    its declaration's fill_from where params has that (the draft SO: the output stream's) (a
    Transformer's / Linear Hybrid's weights as Orthros / Orthros-H). A kind's stack params lacks
    altogether stays absent; params is not modified. Returns (params, "params_key/name" of each
    vector added)."""
    out, added = dict(params), []
    for kind in kinds_of(cfg):
        if kind.params_key not in params:
            continue
        stack, decls = dict(params[kind.params_key]), kind.params(cfg)
        for name in so_names(kind, cfg):
            if name not in stack:
                src = decls[name].fill_from
                if src in stack:  # e.g. the draft SO, a copy of the output stream's
                    stack[name] = np.array(stack[src], copy=True)
                else:
                    fill = np.ones if name.endswith("_scale") else np.zeros
                    shape = (cfg.layers_of(kind.name), *decls[name].shape)
                    stack[name] = fill(shape, np.dtype(cfg.param_dtype))
                added.append(f"{kind.params_key}/{name}")
        out[kind.params_key] = stack
    return out, added


def drop_draft_so(params: Params, cfg: ModelConfig) -> tuple[Params, ModelConfig]:
    """(params, cfg) without the draft scale-offsets (cfg.draft_scale_offset): the same model
    function, for a consumer that has no speculative draft (an export). params is not
    modified."""
    plain, out = cfg.replace(draft_scale_offset=False), dict(params)
    for kind in kinds_of(cfg):
        if kind.params_key in params:
            drop = set(kind.params(cfg)) - set(kind.params(plain))
            out[kind.params_key] = {
                k: v for k, v in params[kind.params_key].items() if k not in drop
            }
    return out, plain


class KindStack(nn.Module):
    """Holds one kind's stacked per-layer parameters; calling it returns them as a dict."""

    cfg: ModelConfig
    kind_name: str

    @nn.compact
    def __call__(self) -> Params:
        cfg, kind = self.cfg, KINDS[self.kind_name]
        decls = lora.with_adapters(kind.params(cfg), cfg)
        return _stacked(self, decls, cfg.layers_of(kind.name), cfg)


class FFNStack(nn.Module):
    """Holds one FFN choice's stacked per-layer parameters (layers/ffn.py); returns them."""

    cfg: ModelConfig
    ffn_name: str

    @nn.compact
    def __call__(self) -> Params:
        cfg, ffn = self.cfg, FFNS[self.ffn_name]
        return _stacked(self, ffn.params(cfg), cfg.ffn_layers(ffn.name), cfg)


def _stacked(module: nn.Module, decls: dict[str, ParamDecl], n: int, cfg: ModelConfig) -> Params:
    """The module's parameters of these per-layer declarations, stacked on a leading [n]
    layers axis (in declaration order: the init keys follow it)."""
    out = {}
    for name, d in decls.items():
        init = nn.with_logical_partitioning(d.init, (LAYERS, *d.axes))
        out[name] = module.param(name, init, (n, *d.shape), cfg.jnp_param_dtype)
    return out


# What the layer loop carries from layer to layer (a pytree: the streams, the cache states).
Carry = TypeVar("Carry")
# body(carry, kind, layer_params, li) -> carry; li: the layer's index in its kind's stack;
# layer_params holds the layer's FFN entry under its params_key too (layers/ffn.py).
LayerBody = Callable[[Carry, LayerKind, Params, LayerIndex], Carry]


def _after(li: LayerIndex, carry: Any, n: int) -> jax.Array:
    """li (a layer index in [0, n), static or traced) unchanged, but computed from the carry
    (min(li, n - 1 + isnan(x)), which XLA cannot fold), so that the layer's weights are read
    only once the layer before has produced its output: without it XLA:CPU reads every layer
    of a loop body's cycle up front (docs/performance.md, "Each layer's index depends on the
    layer before")."""
    leaf = next(
        a for a in jax.tree.leaves(carry) if jax.numpy.issubdtype(a.dtype, jax.numpy.floating)
    )
    probe = jax.numpy.ravel(leaf)[0]
    return jax.numpy.minimum(li, n - 1 + jax.numpy.isnan(probe).astype(jax.numpy.int32))


def layer_loop(
    params: Params,
    cfg: ModelConfig,
    carry: Carry,
    body: LayerBody[Carry],
    *,
    by_index: bool,
    last: LayerBody[Carry] | None = None,
) -> Carry:
    """carry = body(carry, kind, p, li) over every layer in order; the very last layer runs
    `last` instead when given (e.g. without its dead base stream).

    by_index=False: each cycle's parameters are scanned xs (the training forward: gradients
    stay per layer). by_index=True: layers are read by dynamic index out of the whole stacks
    (cached modes: no stack is sliced or copied; kinds write their cache state in place).
    """
    cycle, ffns = cfg.layer_types, cfg.ffn_types
    stacks = {k.name: params[k.params_key] for k in kinds_of(cfg)}
    stacks.update({f"ffn/{f.name}": params[f.params_key] for f in ffns_of(cfg)})
    n_loop = cfg.n_cycles - (last is not None)

    def layer_at(name: str, li: LayerIndex) -> Params:
        return jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, li, keepdims=False), stacks[name]
        )

    def params_at(
        carry: Carry, c: LayerIndex, j: int, cycle_params: Params | None
    ) -> tuple[Params, LayerIndex]:
        """Layer (c, j)'s parameters (its FFN's entry under the FFN's key) and li."""
        name, li = cycle[j], cfg.layer_index(c, j)
        if cycle_params is None:
            li = _after(li, carry, cfg.layers_of(name))
            p = layer_at(name, li)
        else:  # this cycle's slice of the stack: entry layer_index(0, j)
            p = jax.tree.map(operator.itemgetter(cfg.layer_index(0, j)), cycle_params[name])
        p = lora.merged_layer(p, cfg)  # W + (alpha / r) A @ B where the layer has adapters
        if ffns:
            f = ffns[j]
            if cycle_params is None:
                fp = layer_at(f"ffn/{f}", _after(cfg.ffn_index(c, j), carry, cfg.ffn_layers(f)))
            else:
                fp = jax.tree.map(
                    operator.itemgetter(cfg.ffn_index(0, j)), cycle_params[f"ffn/{f}"]
                )
            p = {**p, FFNS[f].params_key: fp}
        return p, li

    def run_cycle(carry: Carry, c: LayerIndex, cycle_params: Params | None, upto: int) -> Carry:
        for j in range(upto):
            p, li = params_at(carry, c, j, cycle_params)
            carry = body(carry, KINDS[cycle[j]], p, li)
        return carry

    if cfg.scan_layers and n_loop > 0:
        if by_index:
            carry = jax.lax.fori_loop(
                0, n_loop, lambda c, x: run_cycle(x, c, None, len(cycle)), carry
            )
        else:
            xs = {}  # [layers of the kind, ...] -> [cycles, occurrences in a cycle, ...]
            for name, s in stacks.items():
                n = ffns.count(name[4:]) if name.startswith("ffn/") else cycle.count(name)
                xs[name] = jax.tree.map(
                    lambda a, n=n: a[: n_loop * n].reshape(n_loop, n, *a.shape[1:]), s
                )

            def scan_body(carry: Carry, inputs: tuple[jax.Array, Params]) -> tuple[Carry, None]:
                c, cycle_params = inputs
                return run_cycle(carry, c, cycle_params, len(cycle)), None

            carry, _ = jax.lax.scan(scan_body, carry, (jax.numpy.arange(n_loop), xs))
    else:
        for c in range(n_loop):
            carry = run_cycle(carry, c, None, len(cycle))
    if last is not None:
        c = cfg.n_cycles - 1
        carry = run_cycle(carry, c, None, len(cycle) - 1)
        p, li = params_at(carry, c, len(cycle) - 1, None)
        carry = last(carry, KINDS[cycle[-1]], p, li)
    return carry


def remat(fn: Callable, cfg: ModelConfig) -> Callable:
    """fn under jax.checkpoint with cfg.remat's policy (unchanged for 'none')."""
    if cfg.remat == "none":
        return fn
    policy = (
        None if cfg.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    )
    return jax.checkpoint(fn, policy=policy, static_argnums=(1,))
