"""The per-row host arrays of one engine call: each slot's sampling settings (RowSampling), its
logit penalties (logit_processing.Penalties) and its stop ids, one row per slot of the call
(None: a padding or idle row, which gets settings that change nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from orthros_jax.inference.logit_processing import Penalties
from orthros_jax.inference.sampling import RowSampling
from orthros_jax.serving.events import Slot
from orthros_jax.serving.requests import MAX_LOGIT_BIAS, MAX_STOP_IDS

STOP_WIDTH = MAX_STOP_IDS + 1  # a slot's stop ids on device: its stop_token_ids and end-of-text


def _col(slots: list[Slot | None], f: Callable[[Slot], Any], idle: Any, dtype: Any) -> np.ndarray:
    return np.array([f(s) if s is not None else idle for s in slots], dtype)


def sampling(slots: list[Slot | None]) -> RowSampling:
    return RowSampling(
        temperature=_col(slots, lambda s: s.req.params.temperature, 0, np.float32),
        top_k=_col(slots, lambda s: s.req.params.top_k, 0, np.int32),
        top_p=_col(slots, lambda s: s.req.params.top_p, 1.0, np.float32),
        seed=_col(slots, lambda s: s.req.seed, 0, np.uint32),
        step=_col(slots, lambda s: s.generated, 0, np.int32),
    )


def stops(slots: list[Slot | None]) -> np.ndarray:
    """[rows, STOP_WIDTH] each slot's stop ids, -1 padded."""
    out = np.full((len(slots), STOP_WIDTH), -1, np.int32)
    for j, s in enumerate(slots):
        if s is not None:
            out[j, : len(s.stop_ids)] = sorted(s.stop_ids)
    return out


def penalties(slots: list[Slot | None]) -> Penalties:
    ids = np.full((len(slots), MAX_LOGIT_BIAS), -1, np.int32)
    values = np.zeros((len(slots), MAX_LOGIT_BIAS), np.float32)
    for j, s in enumerate(slots):
        for k, (t, b) in enumerate(s.req.params.logit_bias if s is not None else ()):
            ids[j, k], values[j, k] = t, b
    p = lambda s: s.req.params
    return Penalties(
        presence=_col(slots, lambda s: p(s).presence_penalty, 0.0, np.float32),
        frequency=_col(slots, lambda s: p(s).frequency_penalty, 0.0, np.float32),
        repetition=_col(slots, lambda s: p(s).repetition_penalty, 1.0, np.float32),
        min_tokens=_col(slots, lambda s: p(s).min_tokens, 0, np.int32),
        bias_ids=ids,
        bias_values=values,
        stops=stops(slots),
    )


def prefill_args(p: int, t: int, max_batch: int, chunks: list[tuple[int, Slot, int]]) -> tuple:
    """device.prefill_rows' (rows, reset, tokens, lengths, sampling, pen) for a [p, t] bucket
    of chunks (row, slot, prompt tokens this call); other rows are padding (id max_batch)."""
    rows = np.full((p,), max_batch, np.int32)  # padding rows: never written
    reset, lengths = np.zeros((p,), bool), np.zeros((p,), np.int32)
    tokens = np.zeros((p, t), np.int32)
    slots: list[Slot | None] = [None] * p
    for j, (i, s, n) in enumerate(chunks):
        rows[j], reset[j], lengths[j], slots[j] = i, s.prefilled == 0, n, s
        tokens[j, :n] = s.req.ids[s.prefilled : s.prefilled + n]
    return rows, reset, tokens, lengths, sampling(slots), penalties(slots)


def decode_args(max_batch: int, rows: list[tuple[int, Slot, int]]) -> tuple:
    """device.decode_rows' (tokens, budget, stops, sampling, pen) for rows (row, slot, steps
    it may run); the others are idle (budget 0)."""
    tokens, budget = np.zeros((max_batch,), np.int32), np.zeros((max_batch,), np.int32)
    slots: list[Slot | None] = [None] * max_batch
    for i, s, n in rows:
        tokens[i], budget[i], slots[i] = s.last, n, s
    return tokens, budget, stops(slots), sampling(slots), penalties(slots)


def plan_prefill(
    slots: list[Slot | None], budget: int, max_rows: int, max_chunk: int
) -> list[tuple[int, int]]:
    """(slot, prompt tokens this step) for the slots still prefilling, oldest first: at most
    max_rows of them, `budget` tokens in all, max_chunk per slot."""
    waiting = [i for i, s in enumerate(slots) if s is not None and not s.decoding]
    waiting.sort(key=lambda i: slots[i].req.arrival)  # type: ignore[union-attr]
    out = []
    for i in waiting[:max_rows]:
        s = slots[i]
        assert s is not None
        n = min(len(s.req.ids) - s.prefilled, budget, max_chunk)
        if n < 1:
            break
        out.append((i, n))
        budget -= n
    return out
