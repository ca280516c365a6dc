"""attention_impl="splash": jax's Pallas splash-attention kernels (TPU) behind the attend seam.

What runs in the kernel (each mask is the seam's rule: same segment, key at or before the query,
within the window; q [B, Tq, N, H], keys [B, S, K, H]; P = the prefix length, 0 in sequence mode):
  aligned keys      the sequence itself (PT/SFT base stream, PT output stream) or a prefill chunk
                    with its W-1 previous keys as `prefix`: the base window is
                    LocalMask((Tq, S), (w-1, 0), offset=P), a global stream CausalMask((Tq, S),
                    offset=P); packed documents by SegmentIds. The masks are over array indices,
                    so positions must rise by exactly one per index inside a segment (the
                    packer's per-document arange; a chunk's slots): the index mask is then the
                    position mask. The packer's padding (segment 0) carries no loss and is
                    exempt. GQA: query head n reads kv head n // (N/K), as everywhere.
  SFT output copies (Keys.q_index: each copy's token index into the keys): scattered to their
                    tokens' indices, causal over T queries, gathered back. Exact in the forward
                    and the gradients: copies of one token are the same function of the
                    parameters at every layer (an output stream reads only the base K/V), so the
                    duplicate the scatter keeps gives every copy's value. Costs T queries, not
                    T_out (SFT rows have T_out < T).
  few queries       <= FEW_QUERIES per row (decode, a prompt's last token): the xla few-query dot.
  other cache reads a chunk's global queries over the whole cache (the Transformer arm's
                    prefill): the xla blocked kernel. A splash mask is static, and a chunk's
                    offset into the cache is traced (per row).
q is scaled by 1/sqrt(H) in float32 before the kernel (splash does not scale) and cast back to
q's dtype. Scores accumulate in float32 inside the kernel.

Interpret mode is automatic: the Mosaic kernel when the mesh in context is on TPU (a TPU
target's abstract mesh under launch/compile.py, a TPU slice under training) or, without one, the
default backend is TPU; Pallas's interpreter otherwise (CPU tests; slow, tiny shapes only). A
GPU mesh is a ValueError: splash is a TPU kernel (use "cudnn" or "xla").

Under a mesh the kernel runs per shard (kernel_mesh.py: rows over the batch axes, heads over
"tensor"); inside the sequence-parallel drivers' shard_map it attends the keys they made whole.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa

from orthros_jax.config import ModelConfig
from orthros_jax.kernels.attention import KEY_PAD_SEGMENT
from orthros_jax.layers.attend import FEW_QUERIES, Keys, xla
from orthros_jax.layers.kernel_mesh import shard_rows_and_heads

# The largest kernel tile; TPU tiles are multiples of 128 lanes.
MAX_BLOCK = 512
LANES = 128


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _platform() -> str:
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.abstract_device is not None:
        return mesh.abstract_device.platform
    return jax.default_backend()


def use_interpret() -> bool:
    """True when the kernel must run in Pallas's interpreter (the target is not a TPU);
    ValueError on a GPU target."""
    platform = _platform()
    if platform in ("gpu", "cuda", "rocm"):
        raise ValueError(
            f"attention_impl='splash' is a TPU kernel; the target platform is {platform!r}: "
            "use 'cudnn' (bf16/fp16) or 'xla'"
        )
    return platform != "tpu"


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, tq: int, s: int, window: int | None, offset: int, interpret: bool) -> Any:
    """The splash kernel of one static mask (built once per shape: mask processing is numpy)."""
    one: Any
    if window is None:
        one = sa.CausalMask((tq, s), offset=offset)
    else:
        one = sa.LocalMask((tq, s), (window - 1, 0), offset)
    bq, bkv = min(MAX_BLOCK, tq), min(MAX_BLOCK, s)
    blocks = sa.BlockSizes(
        block_q=bq,
        block_kv=bkv,
        block_kv_compute=bkv,
        block_q_dkv=bq,
        block_kv_dkv=bkv,
        block_kv_dkv_compute=bkv,
        block_q_dq=bq,
        block_kv_dq=bkv,
    )
    # Concrete mask arrays even when first built inside a trace (the cache outlives it).
    with jax.ensure_compile_time_eval():
        return sa.make_splash_mha(
            sa.MultiHeadMask([one] * heads),
            block_sizes=blocks,
            head_shards=1,
            q_seq_shards=1,
            interpret=interpret,
        )


def _pad_to(x: jax.Array, axis: int, length: int, value: Any = 0) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _local_call(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_seg: jax.Array,
    k_seg: jax.Array,
    window: int | None,
    offset: int,
    interpret: bool,
) -> jax.Array:
    """One shard's rows: q [b, n, Tq, H] (pre-scaled), k, v [b, kv, S, H], segments [b, Tq] /
    [b, S]. Query i's own key is key offset + i. Returns [b, n, Tq, H]."""
    tq, s = q.shape[2], k.shape[2]
    tq_pad = _round_up(tq, min(MAX_BLOCK, _round_up(tq, LANES)))
    # Every padded query i >= tq reads the padded key offset + i (same pad segment), so no row
    # of the kernel is empty (an empty row would divide by zero in its softmax).
    need = max(s, offset + tq_pad)
    s_pad = _round_up(need, min(MAX_BLOCK, _round_up(need, LANES)))
    q = _pad_to(q, 2, tq_pad)
    k, v = _pad_to(k, 2, s_pad), _pad_to(v, 2, s_pad)
    q_seg = _pad_to(q_seg, 1, tq_pad, KEY_PAD_SEGMENT)
    k_seg = _pad_to(k_seg, 1, s_pad, KEY_PAD_SEGMENT)
    kernel = _kernel(q.shape[1], tq_pad, s_pad, window, offset, interpret)
    out = jax.vmap(lambda *a: kernel(*a[:3], segment_ids=sa.SegmentIds(*a[3:])))(
        q, k, v, q_seg, k_seg
    )
    return out[:, :, :tq]


def splash_attention_BNTH(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_seg: jax.Array,
    k_seg: jax.Array,
    window: int | None,
    offset: int,
) -> jax.Array:
    """Masked attention by the splash kernel: q [B, N, Tq, H], k, v [B, K, S, H] head-major,
    segment ids [B, Tq] / [B, S]; query i is at key index offset + i (LocalMask of `window`
    keys, or CausalMask if None). Scales q by 1/sqrt(H); returns [B, N, Tq, H] in q's dtype."""
    interpret = use_interpret()
    dtype = q.dtype
    q = (q.astype(jnp.float32) / math.sqrt(q.shape[-1])).astype(dtype)
    k, v = k.astype(dtype), v.astype(dtype)
    q_seg, k_seg = q_seg.astype(jnp.int32), k_seg.astype(jnp.int32)
    call = functools.partial(_local_call, window=window, offset=offset, interpret=interpret)
    return shard_rows_and_heads(
        call, (q, k, v, q_seg, k_seg), (1, 1, 1, None, None), q.shape[1], k.shape[1]
    )


def _scatter_copies(x: jax.Array, index: jax.Array, length: int) -> jax.Array:
    """x [B, Lq, ...] -> [B, length, ...] with x[b, i] at index[b, i] (others 0)."""
    scatter = lambda a, i: jnp.zeros((length, *a.shape[1:]), a.dtype).at[i].set(a)
    return jax.vmap(scatter)(x, index)


def splash(
    q: jax.Array,
    q_pos: jax.Array,
    q_seg: jax.Array,
    keys: Keys,
    window: int | None,
    cfg: ModelConfig,
) -> jax.Array:
    """The seam's "splash" implementation (see the module docstring for what goes where).
    q [B, Lq, N, H] at (positions, segment ids) [B, Lq]; returns [B, Lq, N, H] in q's dtype."""

    if q.shape[1] <= FEW_QUERIES:
        return xla(q, q_pos, q_seg, keys, window, cfg)
    k, v = keys.head_major_kv()
    if keys.aligned:
        k_seg, offset = keys.segment_ids, 0
        if keys.prefix is not None:
            pk, pv, _, pseg = keys.prefix
            k = jnp.concatenate([jnp.swapaxes(pk, 1, 2).astype(k.dtype), k], 2)
            v = jnp.concatenate([jnp.swapaxes(pv, 1, 2).astype(v.dtype), v], 2)
            k_seg, offset = jnp.concatenate([pseg, k_seg], 1), pk.shape[1]
        out = splash_attention_BNTH(jnp.swapaxes(q, 1, 2), k, v, q_seg, k_seg, window, offset)
        return jnp.swapaxes(out, 1, 2)
    if keys.q_index is not None and window is None and keys.prefix is None:
        t = k.shape[2]
        q_full = jnp.swapaxes(_scatter_copies(q, keys.q_index, t), 1, 2)
        seg = keys.segment_ids  # each scattered query sits at its token: the token's segment
        out = jnp.swapaxes(splash_attention_BNTH(q_full, k, v, seg, seg, None, 0), 1, 2)
        return jnp.take_along_axis(out, keys.q_index[:, :, None, None], axis=1)
    return xla(q, q_pos, q_seg, keys, window, cfg)
