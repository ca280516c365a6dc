"""What flows between the engine and its clients: a submitted Request, the Events it hears,
and the engine's per-slot progress of it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from orthros_jax.serving.requests import SamplingParams
from orthros_jax.serving.text import TextStream


@dataclasses.dataclass
class Event:
    """What a request hears. kind "token": text (may be empty), token, logprob, top [(id, lp)],
    sample_logprob (the token's log-prob under the distribution it was drawn from: the
    temperature-scaled, filtered one; 0 for greedy rows); "done": finish_reason ("stop" /
    "length" / "cancelled"), text (the rest), usage counts, and with a stop id the id that
    ended it as token (with its sample_logprob); "error": error (a message)."""

    kind: str
    text: str = ""
    token: int | None = None
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    sample_logprob: float | None = None


class Request:
    """A submitted request. cancel() frees its slot at the next engine step."""

    def __init__(
        self, ids: list[int], params: SamplingParams, on_event: Callable[[Event], Any], seed: int
    ) -> None:
        self.ids, self.params, self.on_event, self.seed = list(ids), params, on_event, seed
        self.cancelled = False
        self.arrival = time.perf_counter()
        self.first_token_at: float | None = None


@dataclasses.dataclass
class Slot:
    """An engine slot's request and its progress (engine thread only)."""

    req: Request
    text: TextStream
    stop_ids: frozenset[int]
    prefilled: int = 0  # prompt tokens in the cache
    generated: int = 0
    last: int = 0  # the token to feed next

    @classmethod
    def of(cls, req: Request, text: TextStream, eos_id: int | None, prefilled: int = 0) -> Slot:
        """A slot for req: its stop ids (stop_token_ids and eos_id unless ignore_eos), its
        first `prefilled` prompt tokens already in the row (a reused prefix)."""
        stop_ids = set(req.params.stop_token_ids)
        if eos_id is not None and not req.params.ignore_eos:
            stop_ids.add(eos_id)
        return cls(req, text, frozenset(stop_ids), prefilled=prefilled)

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.req.ids)

    def token_event(self, tok: int, sampled: Any, j: int) -> Event:
        """The "token" event of row j of a sampled batch (inference.sampling.Sampled, on the
        host), with the API's log-probs when the request asked for them."""
        n = self.req.params.logprobs
        lp = float(sampled.sample_logprob[j])
        event = Event("token", text=self.text.add(tok), token=tok, sample_logprob=lp)
        if n is not None:
            event.logprob = float(sampled.logprob[j])
            ids, lps = sampled.top_ids[j][:n].tolist(), sampled.top_logprobs[j][:n].tolist()
            event.top = list(zip(ids, lps, strict=True))
        return event

    def timings(self) -> tuple[float | None, float | None]:
        """(time to the first token, time per output token after it) in seconds; None where
        there is no such token."""
        ttft = tpot = None
        if self.req.first_token_at is not None:
            ttft = self.req.first_token_at - self.req.arrival
            if self.generated > 1:
                tpot = (time.perf_counter() - self.req.first_token_at) / (self.generated - 1)
        return ttft, tpot

    def final_event(
        self, reason: str, error: str | None, stop: tuple[int, float] | None = None
    ) -> Event:
        """The request's last event: "error" with the message, else "done" with the rest of the
        text and the usage; stop: (id, sample_logprob) of the stop id that ended it (never
        streamed as text)."""
        if error is not None:
            return Event("error", error=error)
        rest = "" if reason == "cancelled" else self.text.finish()
        event = Event(
            "done",
            text=rest,
            finish_reason=reason,
            prompt_tokens=len(self.req.ids),
            completion_tokens=self.generated,
        )
        if stop is not None:
            event.token, event.sample_logprob = stop
        return event
