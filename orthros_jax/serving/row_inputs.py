"""The per-row host arrays of one engine call: each slot's sampling settings (RowSampling), its
logit penalties (logit_processing.Penalties) and its stop ids, one row per slot of the call
(None: a padding or idle row, which gets settings that change nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from orthros_jax.inference.logit_processing import Penalties
from orthros_jax.serving.events import Slot
from orthros_jax.serving.requests import MAX_LOGIT_BIAS, MAX_STOP_IDS
from orthros_jax.serving.rowsample import RowSampling

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
