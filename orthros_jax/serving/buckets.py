"""The engine's bucketed shapes: the prefill call takes [P, T] for P in its batch buckets and T
in its length buckets, so every shape it runs is compiled once, at warm-up."""

from __future__ import annotations

from orthros_jax.config import ModelConfig


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
