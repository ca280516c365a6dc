"""Continuation scoring for the harness model: requests -> bucketed SFT batches -> log-probs.

A request is (context ids, continuation ids). Its model input is the causal-LM window of
lm-evaluation-harness: (context + continuation)[-(max_length + 1):][:-1], i.e. the context is
left-truncated so that every continuation token is predicted with as much context as fits.
The continuation's c tokens are predicted at the input's last c indices, and only there does
the forward place output copies (SFT mode): for Orthros the cost of a long context is the base
stream's linear pass. The single-stream arms gather the same positions from their one stream.

Batches have a fixed row count and power-of-two lengths (T for the input, T_out for the
continuation), so a whole task compiles a handful of programs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.model import OrthrosLM, Params
from orthros_jax.training.losses import model_logits

MIN_SEQ_BUCKET = 32
MIN_OUT_BUCKET = 4


@dataclasses.dataclass(frozen=True)
class ScoreRow:
    """One request as the model sees it: tokens [n] (the input window) and targets [c] (the
    continuation), predicted at input indices n - c ... n - 1."""

    tokens: np.ndarray
    targets: np.ndarray

    @property
    def output_index(self) -> np.ndarray:
        """Input indices [c] whose next-token logits score the continuation."""
        n, c = len(self.tokens), len(self.targets)
        return np.arange(n - c, n, dtype=np.int32)


def score_row(context: Sequence[int], continuation: Sequence[int], max_length: int) -> ScoreRow:
    """The input window of a (context, continuation) request, left-truncated to max_length.

    Raises ValueError when the continuation is empty, the context is empty, or the
    continuation alone is longer than max_length (it could not all be scored)."""
    if len(continuation) == 0:
        raise ValueError("a loglikelihood request has an empty continuation (nothing to score)")
    if len(context) == 0:
        raise ValueError("a loglikelihood request has an empty context (give a prefix token)")
    if len(continuation) > max_length:
        raise ValueError(
            f"a continuation of {len(continuation)} tokens does not fit max_length={max_length}; "
            "raise max_length (model_args max_length=...)"
        )
    whole = np.asarray([*context, *continuation], np.int32)
    return ScoreRow(whole[-(max_length + 1) :][:-1], whole[len(whole) - len(continuation) :])


def bucket(n: int, minimum: int, cap: int | None = None) -> int:
    """The smallest power of two >= max(n, minimum), at most cap (when cap >= n)."""
    size = max(minimum, 1 << max(0, int(n) - 1).bit_length())
    return max(int(n), min(size, cap)) if cap is not None else size


def batches(
    rows: Sequence[ScoreRow], batch_size: int, max_length: int
) -> Iterator[tuple[list[int], dict[str, np.ndarray]]]:
    """(row indices, SFT batch) over rows, longest first, batch_size rows each.

    Batch: tokens, positions, segment_ids [B, T]; output_positions, targets, mask [B, T_out].
    Positions run 0..T-1 along the whole row (padding included, as segment 0) so they rise
    inside every segment; short batches are filled with copies of their first row."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(rows)), key=lambda i: (-len(rows[i].tokens), i))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        chunk = [rows[i] for i in idx]
        t = bucket(max(len(r.tokens) for r in chunk), MIN_SEQ_BUCKET, max_length)
        t_out = bucket(max(len(r.targets) for r in chunk), MIN_OUT_BUCKET, t)
        chunk += [chunk[0]] * (batch_size - len(chunk))
        out = {
            "tokens": np.zeros((batch_size, t), np.int32),
            "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (batch_size, t)).copy(),
            "segment_ids": np.zeros((batch_size, t), np.int32),
            "output_positions": np.zeros((batch_size, t_out), np.int32),
            "targets": np.zeros((batch_size, t_out), np.int32),
            "mask": np.zeros((batch_size, t_out), bool),
        }
        for r, row in enumerate(chunk):
            n, c = len(row.tokens), len(row.targets)
            out["tokens"][r, :n] = row.tokens
            out["segment_ids"][r, :n] = 1
            out["output_positions"][r, :c] = row.output_index
            out["targets"][r, :c] = row.targets
            out["mask"][r, :c] = True
        yield idx, out


@functools.partial(jax.jit, static_argnames="cfg")
def _token_scores(
    params: Params, batch: dict[str, jax.Array], cfg: ModelConfig
) -> tuple[jax.Array, jax.Array]:
    logits = model_logits(OrthrosLM(cfg), params, batch)  # [B, T_out, V] float32
    logp = jax.nn.log_softmax(logits, axis=-1)
    target_logp = jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
    greedy = jnp.argmax(logits, axis=-1) == batch["targets"]
    return target_logp, greedy


def token_scores(
    cfg: ModelConfig, params: Params, batch: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Per continuation token of a batch from `batches`: log p(target) [B, T_out] float32 and
    whether the target is the argmax [B, T_out] bool (padding entries are garbage)."""
    feed = {k: jnp.asarray(v) for k, v in batch.items() if k != "mask"}
    logp, greedy = _token_scores(params, feed, cfg=cfg)
    return np.asarray(logp), np.asarray(greedy)


def score_rows(
    cfg: ModelConfig,
    params: Params,
    rows: Sequence[ScoreRow],
    batch_size: int,
    max_length: int,
    progress: Callable[[int], None] | None = None,
) -> list[tuple[float, bool]]:
    """(sum of log p over the continuation, every continuation token greedy) per row, in the
    order of rows. `progress(k)` is called after each batch with its k rows (a progress bar)."""
    out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    for idx, batch in batches(rows, batch_size, max_length):
        logp, greedy = token_scores(cfg, params, batch)
        for r, i in enumerate(idx):
            c = len(rows[i].targets)
            out[i] = (float(logp[r, :c].astype(np.float64).sum()), bool(greedy[r, :c].all()))
        if progress is not None:
            progress(len(idx))
    return out
