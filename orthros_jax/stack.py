"""The layer stack: which kind each layer is, its parameters, and the one loop over layers.

A stack is `cfg.n_cycles` repetitions of the cycle `cfg.layer_types` (e.g. three gated
DeltaNet layers then one attention layer). Each kind's parameters are stacked on a leading
axis over the layers of that kind, under the kind's `params_key` ("layers" for attention, so
uniform stacks keep the historic layout). Layer j of cycle c is layer c * count + rank of its
kind's stack, where count is how often the kind occurs in the cycle and rank its occurrence
index within the cycle. `layer_loop` is the only loop over layers: a scan over cycles (reading
parameters as scanned xs for the training forward, or by dynamic index out of the whole stack
for the cached modes, which measured faster there), unrolled with cfg.scan_layers=False.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from orthros_jax import attention_layer, gdn_layer
from orthros_jax.axes import LAYERS
from orthros_jax.config import ModelConfig
from orthros_jax.layer_kind import LayerKind, Params

KINDS: dict[str, LayerKind] = {"attention": attention_layer.KIND, "gdn": gdn_layer.KIND}


def kinds_of(cfg: ModelConfig) -> list[LayerKind]:
    """The kinds a config uses, in cycle order, each once."""
    return [KINDS[name] for name in dict.fromkeys(cfg.layer_types)]


class KindStack(nn.Module):
    """Holds one kind's stacked per-layer parameters; calling it returns them as a dict."""

    cfg: ModelConfig
    kind_name: str

    @nn.compact
    def __call__(self) -> Params:
        cfg, kind = self.cfg, KINDS[self.kind_name]
        n = cfg.layers_of(kind.name)
        out = {}
        for name, (shape, axes) in kind.param_shapes(cfg).items():
            init = nn.with_logical_partitioning(kind.init_for(name, cfg), (LAYERS, *axes))
            out[name] = self.param(name, init, (n, *shape), cfg.jnp_param_dtype)
        return out


# body(carry, kind, layer_params, li) -> carry; li: the layer's index in its kind's stack.
LayerBody = Callable[[Any, LayerKind, Params, Any], Any]


def layer_loop(
    params: Params,
    cfg: ModelConfig,
    carry: Any,
    body: LayerBody,
    *,
    by_index: bool,
    last: LayerBody | None = None,
) -> Any:
    """carry = body(carry, kind, p, li) over every layer in order; the very last layer runs
    `last` instead when given (e.g. without its dead base stream).

    by_index=False: each cycle's parameters are scanned xs (the training forward: gradients
    stay per layer). by_index=True: layers are read by dynamic index out of the whole stacks
    (cached modes: no stack is sliced or copied; kinds write their cache state in place).
    """
    cycle = cfg.layer_types
    counts = {name: cycle.count(name) for name in cycle}
    ranks = [cycle[:j].count(name) for j, name in enumerate(cycle)]
    stacks = {k.name: params[k.params_key] for k in kinds_of(cfg)}
    n_loop = cfg.n_cycles - (last is not None)

    def layer_at(name: str, li):
        return jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, li, keepdims=False), stacks[name]
        )

    def run_cycle(carry, c, cycle_params, upto: int):
        for j in range(upto):
            name = cycle[j]
            li = c * counts[name] + ranks[j]
            if cycle_params is None:
                p = layer_at(name, li)
            else:
                p = jax.tree.map(lambda a, r=ranks[j]: a[r], cycle_params[name])
            carry = body(carry, KINDS[name], p, li)
        return carry

    if cfg.scan_layers and n_loop > 0:
        if by_index:
            carry = jax.lax.fori_loop(
                0, n_loop, lambda c, x: run_cycle(x, c, None, len(cycle)), carry
            )
        else:
            xs = {
                name: jax.tree.map(
                    lambda a, n=counts[name]: a[: n_loop * n].reshape(n_loop, n, *a.shape[1:]), s
                )
                for name, s in stacks.items()
            }

            def scan_body(carry, inputs):
                c, cycle_params = inputs
                return run_cycle(carry, c, cycle_params, len(cycle)), None

            carry, _ = jax.lax.scan(scan_body, carry, (jax.numpy.arange(n_loop), xs))
    else:
        for c in range(n_loop):
            carry = run_cycle(carry, c, None, len(cycle))
    if last is not None:
        c = cfg.n_cycles - 1
        carry = run_cycle(carry, c, None, len(cycle) - 1)
        name = cycle[-1]
        li = c * counts[name] + ranks[-1]
        carry = last(carry, KINDS[name], layer_at(name, li), li)
    return carry


def remat(fn: Callable, cfg: ModelConfig) -> Callable:
    """fn under jax.checkpoint with cfg.remat's policy (unchanged for 'none')."""
    if cfg.remat == "none":
        return fn
    policy = (
        None if cfg.remat == "full" else jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    )
    return jax.checkpoint(fn, policy=policy, static_argnums=(1,))
