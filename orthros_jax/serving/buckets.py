"""The engine's sizes, checked, and its bucketed shapes: the prefill call takes [P, T] for P in
its batch buckets and T in its length buckets, so every shape it runs is compiled once, at
warm-up."""

from __future__ import annotations

from typing import Any

from orthros_jax.config import ModelConfig
from orthros_jax.config.options import check_positive_int
from orthros_jax.inference.speculative import Speculative
from orthros_jax.inference.speculative import check as check_speculation
from orthros_jax.parallel.sequence import check_mesh as check_sequence_mesh
from orthros_jax.parallel.sequence import sequence_size


def pow2_upto(lo: int, hi: int) -> tuple[int, ...]:
    """lo, 2 lo, 4 lo, ... up to hi, hi included."""
    out = [lo]
    while out[-1] < hi:
        out.append(min(out[-1] * 2, hi))
    return tuple(out)


def prefill_buckets(
    cfg: ModelConfig,
    chunk_budget: int,
    max_batch: int,
    lengths: tuple[int, ...] | None,
    batches: tuple[int, ...] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(length buckets, batch buckets), sorted: the given ones checked, else powers of two
    (8 .. chunk_budget tokens, 1 .. max_batch rows). A length above cfg.prefill_chunk must be a
    multiple of it (the prefill runs in chunks)."""
    lengths = tuple(sorted(lengths or pow2_upto(8, chunk_budget)))
    for t in lengths:
        if t < 1 or (t > cfg.prefill_chunk and t % cfg.prefill_chunk):
            raise ValueError(
                f"Engine: prefill_lengths entry {t} must be <= prefill_chunk="
                f"{cfg.prefill_chunk} or a multiple of it"
            )
    batches = tuple(sorted(batches or pow2_upto(1, max_batch)))
    if batches[-1] > max_batch or batches[0] < 1:
        raise ValueError(f"Engine: prefill_batches {batches} must be in [1, {max_batch}]")
    return lengths, batches


def fit(buckets: tuple[int, ...], n: int) -> int:
    """The smallest bucket that holds n."""
    return next(b for b in buckets if b >= n)


def check_mesh(cfg: ModelConfig, mesh: object, max_batch: int, max_len: int) -> None:
    """Nothing for mesh=None (one device); else ValueError (before any array or compile) unless the
    engine can serve on this mesh: a "sequence" axis > 1 and what init_cache(..., mesh=) accepts
    (max_len a multiple of the sequence size, max_batch of the batch axes, layer kinds whose cache
    grows with slots, no tensor axis). A mesh of shapes (jax.sharding.AbstractMesh) is enough."""
    if mesh is None:
        return
    shape = getattr(mesh, "shape", None)
    if not hasattr(shape, "get") or sequence_size(mesh) < 2:  # type: ignore[arg-type]
        raise ValueError(
            f"Engine: mesh must have a 'sequence' axis > 1 (got {shape}); use mesh=None to "
            "serve on one device"
        )
    check_sequence_mesh(cfg, max_batch, max_len, mesh)  # type: ignore[arg-type]


def check_engine(
    cfg: ModelConfig,
    mesh: Any,
    *,
    batch_wait_s: float,
    prefix_caching: bool,
    speculative: Speculative | None = None,
    **sizes: int,
) -> None:
    """ValueError naming the Engine argument that does not fit: sizes (max_batch, max_len,
    chunk_budget, max_queue, decode_steps) positive ints, the mesh (check_mesh),
    batch_wait_s in [0, 1] seconds, prefix caching on one device only, a speculation this
    model and cache can run (speculative.check) without prefix caching."""
    for name, v in sizes.items():
        check_positive_int(f"Engine: {name}", v)
    check_mesh(cfg, mesh, sizes["max_batch"], sizes["max_len"])
    if prefix_caching and mesh is not None:
        raise ValueError("Engine: prefix_caching is for one device (mesh=None)")
    number = isinstance(batch_wait_s, int | float) and not isinstance(batch_wait_s, bool)
    if not number or not 0 <= batch_wait_s <= 1:
        raise ValueError(f"Engine: batch_wait_s must be in [0, 1] seconds, got {batch_wait_s!r}")
    if speculative is not None:
        check_speculation(speculative, cfg, sizes["max_len"], sequence_split=mesh is not None)
        if prefix_caching:
            raise ValueError("Engine: speculative does not run with prefix_caching")
