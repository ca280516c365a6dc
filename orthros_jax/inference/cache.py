"""The cache: an explicit pytree holding every layer kind's state for a batch of rows.

  states   {kind name: that kind's state stacked over its layers} (the kind's init_state;
           attention: head-major K/V [layers, B, K, S, H]; gated DeltaNet: conv windows and
           the recurrent state, which do not grow with S)
  lengths  [B] int32, the number of filled slots of each row
  max_len  S, slots per row (static)
Head-major K/V keep each (row, kv head)'s history a contiguous [S, H] matrix, so the one-query
attention of a decode step is a plain batched mat-vec over the cache with no transpose
(docs/performance.md, "Head-major KV cache").

kv_cache_dtype "int8" (or "fp8" = float8_e4m3fn, "float8_e5m2") stores the K/V of every kind
whose state grows with slots (attention) quantized: kernels/slots.QuantKV, values plus one
scale per token and kv head in the cache's dtype; the recurrent kinds' states stay at full
precision. A quantized leaf's scale has its values' logical axes without the last (head_dim).

Slot s of a row holds the state of the token at position s, so every mask is "slot < lengths"
(plus the window for the base stream). Slots >= lengths are stale or zero and are never read
unmasked. Orthros keeps the full history (the output stream reads all of it); the window only
limits what the base stream reads. The container knows no kind: it holds what each registered
kind declares (layers/registry.py).
"""

from __future__ import annotations

from typing import Any, Generic

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from typing_extensions import TypeVar

from orthros_jax.axes import BATCH
from orthros_jax.config import ModelConfig
from orthros_jax.kernels import slots as slot_ops
from orthros_jax.layers.kind import KindState, StateAxes
from orthros_jax.layers.registry import KINDS, kinds_of
from orthros_jax.parallel import mesh as pmesh
from orthros_jax.parallel import sequence as pseq

# A cache's leaves: arrays, or (cache_shardings' tree of the same structure) their shardings.
Leaf = TypeVar("Leaf", jax.Array, NamedSharding, default=jax.Array)
# {kind name: that kind's state stacked over its layers (kind.KindState)}.
KindStates = dict[str, KindState]


class KVCache(flax.struct.PyTreeNode, Generic[Leaf]):
    """Every layer kind's state of a batch of rows (KVCache[NamedSharding]: their shardings).
    See the module docstring."""

    states: KindStates
    lengths: Leaf  # [B] int32
    max_len: int = flax.struct.field(pytree_node=False)

    def with_states(self, states: KindStates, lengths: Leaf) -> KVCache[Leaf]:
        """This cache with some kinds' states and the lengths replaced."""
        return self.replace(states={**self.states, **states}, lengths=lengths)

    @property
    def batch_size(self: KVCache[jax.Array]) -> int:
        return self.lengths.shape[0]


KV_ALIASES = {"fp8": "float8_e4m3fn"}


def resolve_kv_dtype(kv_cache_dtype: str | None) -> str | None:
    """The quantized storage dtype's name (int8, float8_e4m3fn, float8_e5m2), or None for a
    full-precision cache. ValueError for anything else."""
    if kv_cache_dtype is None:
        return None
    name = KV_ALIASES.get(kv_cache_dtype, kv_cache_dtype)
    if name not in slot_ops.QUANT_MAX:
        raise ValueError(
            f"kv_cache_dtype must be None (the cache's dtype) or one of "
            f"{sorted([*slot_ops.QUANT_MAX, *KV_ALIASES])}, got {kv_cache_dtype!r}"
        )
    return name


def kind_states(
    cfg: ModelConfig, batch_size: int, max_len: int, dtype: jnp.dtype, kv_dtype: str | None = None
) -> KindStates:
    """Each used layer kind's zero state stacked over its layers, by kind name; with kv_dtype
    (resolve_kv_dtype's), the K/V of kinds that grow with slots as QuantKV."""
    out = {}
    for kind in kinds_of(cfg):
        state = kind.init_state(cfg, cfg.layers_of(kind.name), batch_size, max_len, dtype)
        if kv_dtype is not None and not kind.recurrent:
            state = jax.tree.map(lambda a: slot_ops.quant_zeros(a.shape, kv_dtype, a.dtype), state)
        out[kind.name] = state
    return out


def kv_cache_dtype(cache: KVCache) -> str | None:
    """The quantized storage dtype of this cache's K/V (None: full precision)."""
    is_q = lambda x: isinstance(x, slot_ops.QuantKV)
    for leaf in jax.tree.leaves(cache.states, is_leaf=is_q):
        if is_q(leaf):
            return str(leaf.values.dtype)
    return None


def _is_axes(x: Any) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def leaf_axes(axes: StateAxes, states: KindState) -> StateAxes:
    """A kind's state_axes tree laid over its state: a QuantKV leaf gets QuantKV(axes, axes
    without the last) (its scale has no head_dim)."""

    def one(ax: tuple, leaf: Any) -> tuple | slot_ops.QuantKV:
        return slot_ops.QuantKV(ax, ax[:-1]) if isinstance(leaf, slot_ops.QuantKV) else ax

    return jax.tree.map(one, axes, states, is_leaf=_is_axes)


def cache_shardings(
    cfg: ModelConfig, batch_size: int, max_len: int, mesh: Mesh, kv_dtype: str | None = None
) -> KVCache[NamedSharding]:
    """KVCache of NamedShardings: every kind's state split by its own `state_axes` and the
    rules of parallel/mesh.py (attention K/V over batch, kv heads and slots, head_dim whole; the
    GDN state over batch and heads), lengths [B] over batch. kv_dtype: a quantized cache's."""
    shapes = jax.eval_shape(lambda: kind_states(cfg, batch_size, max_len, cfg.jnp_dtype, kv_dtype))
    states = {
        name: jax.tree.map(
            lambda axes, a: NamedSharding(mesh, pmesh.shard_spec(axes, a.shape, mesh)),
            leaf_axes(KINDS[name].state_axes(cfg), shape),
            shape,
            is_leaf=_is_axes,
        )
        for name, shape in shapes.items()
    }
    rows = NamedSharding(mesh, pmesh.shard_spec((BATCH,), (batch_size,), mesh))
    return KVCache(states, rows, max_len)


def init_cache(
    cfg: ModelConfig,
    batch_size: int,
    max_len: int,
    dtype: jnp.dtype | str | None = None,
    *,
    kv_cache_dtype: str | None = None,
    mesh: Mesh | None = None,
) -> KVCache:
    """An empty cache of `max_len` slots per row, in `dtype` (default: the activation dtype).

    kv_cache_dtype: "int8" / "fp8" (float8_e4m3fn) / "float8_e5m2" store the attention K/V
    quantized, one `dtype` scale per token and kv head (module docstring); None: in `dtype`.

    mesh: a jax.sharding.Mesh to split the cache over by the rules: rows over the batch axes,
    slots over "sequence" (parallel/mesh.sequence_mesh). With a sequence axis > 1, prefill,
    decode_step and generate run sequence-parallel on it (inference/sequence_parallel.py).
    ValueError when the batch or max_len does not divide over the mesh."""
    for name, value in (("batch_size", batch_size), ("max_len", max_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"init_cache: {name} must be a positive int, got {value!r}")
    dt = jnp.dtype(dtype or cfg.dtype)
    kv = resolve_kv_dtype(kv_cache_dtype)

    def empty() -> KVCache:
        states = kind_states(cfg, batch_size, max_len, dt, kv)
        return KVCache(states, jnp.zeros((batch_size,), jnp.int32), max_len)

    if mesh is None:
        return empty()
    pseq.check_mesh(cfg, batch_size, max_len, mesh)
    return jax.jit(empty, out_shardings=cache_shardings(cfg, batch_size, max_len, mesh, kv))()


def check_cache(cache: KVCache, cfg: ModelConfig) -> None:
    """ValueError unless the cache holds exactly the states this config's kinds declare (shapes
    and structure), e.g. a cache made for another config."""
    kv = kv_cache_dtype(cache)
    want = jax.eval_shape(
        lambda: kind_states(cfg, cache.batch_size, cache.max_len, jnp.float32, kv)
    )
    got_kinds, want_kinds = sorted(cache.states), sorted(want)
    if got_kinds != want_kinds:
        raise ValueError(f"cache holds states of kinds {got_kinds}; this config has {want_kinds}")
    for name in want_kinds:
        got = jax.tree.map(lambda a: tuple(a.shape), cache.states[name])
        exp = jax.tree.map(lambda a: tuple(a.shape), want[name])
        if got != exp:
            raise ValueError(f"cache {name} state has shapes {got}; this config needs {exp}")
