"""What a client asks for, validated: sampling settings, stops, and the prompt as token ids.

Every check raises RequestError naming the offending field (the API answers it with HTTP 400
and an OpenAI-style error body), before anything reaches the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

MAX_STOP_STRINGS = 4  # as the OpenAI API
MAX_SEED = 2**32 - 1
MAX_STOP_IDS = 15  # stop_token_ids per request (+ the end-of-text id: the engine's stop table)


class RequestError(ValueError):
    """A bad request: `param` names the field, `status` the HTTP status (400 unless set)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One request's settings. temperature 0 is greedy; top_k 0 and top_p 1 are off; seed None
    draws one; logprobs None returns none, n >= 0 the chosen token's and n alternatives."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    x = body.get(name)
    if x is None:
        return default
    if isinstance(x, bool) or not isinstance(x, int | float) or not lo <= x <= hi:
        raise RequestError(f"'{name}' must be a number in [{lo}, {hi}], got {x!r}", name)
    return float(x)


def _int(body: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    x = body.get(name)
    if x is None:
        return default
    if not _is_int(x) or not lo <= x <= hi:
        raise RequestError(f"'{name}' must be an integer in [{lo}, {hi}], got {x!r}", name)
    return x


def check_utf8(text: str, field: str) -> str:
    """text if it is valid Unicode that encodes to UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"'{field}' is not valid UTF-8 text ({e.reason})", field) from None
    return text


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"'stop' takes at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(check_utf8(s, "stop") for s in stops)


def sampling_params(body: dict, vocab_size: int, max_len: int, max_logprobs: int) -> SamplingParams:
    """SamplingParams from an OpenAI request body (completions or chat)."""
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    field = "max_tokens" if "max_tokens" in body else "max_completion_tokens"
    if max_tokens is None:
        max_tokens = 16
    if not _is_int(max_tokens) or not 1 <= max_tokens <= max_len:
        raise RequestError(
            f"'{field}' must be an integer in [1, {max_len}], got {max_tokens!r}", field
        )
    n = body.get("n", 1)
    if n != 1 or not _is_int(n):
        raise RequestError(f"'n' must be 1 (one choice per prompt), got {n!r}", "n")
    ids = body.get("stop_token_ids") or []
    if (not isinstance(ids, list) or len(ids) > MAX_STOP_IDS
            or not all(_is_int(i) and 0 <= i < vocab_size for i in ids)):  # fmt: skip
        raise RequestError(
            f"'stop_token_ids' must be at most {MAX_STOP_IDS} token ids in [0, {vocab_size})",
            "stop_token_ids",
        )
    logprobs = body.get("logprobs")
    if isinstance(logprobs, bool):  # chat: logprobs true/false + top_logprobs
        logprobs = _int(body, "top_logprobs", 0, 0, max_logprobs) if logprobs else None
    elif logprobs is not None:
        logprobs = _int(body, "logprobs", None, 0, max_logprobs)
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError("'ignore_eos' must be a boolean", "ignore_eos")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        top_k=_int(body, "top_k", 0, 0, vocab_size),
        seed=_int(body, "seed", None, 0, MAX_SEED),
        stop=_stops(body),
        stop_token_ids=tuple(ids),
        logprobs=logprobs,
        ignore_eos=ignore_eos,
    )


def prompt_ids(
    prompt: Any, encode, vocab_size: int, max_len: int, field: str = "prompt"
) -> list[list[int]]:
    """The prompts of a completions request as token-id lists: a string, a list of ids, or a
    non-empty list of either (one choice each). Empty, non-UTF-8, out-of-vocabulary and
    too-long prompts are refused."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and _is_int(prompt[0])):
        prompts: Sequence[Any] = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    else:
        raise RequestError(
            f"'{field}' must be a non-empty string, token-id list, or list of them", field
        )
    out = []
    for p in prompts:
        if isinstance(p, str):
            ids = encode(check_utf8(p, field)) if p else []
        elif isinstance(p, list) and all(_is_int(i) for i in p):
            bad = [i for i in p if not 0 <= i < vocab_size]
            if bad:
                raise RequestError(
                    f"'{field}' has token id {bad[0]} outside [0, {vocab_size})", field
                )
            ids = list(p)
        else:
            raise RequestError(f"'{field}' must be a string or a list of integer token ids", field)
        if not ids:
            raise RequestError(f"'{field}' is empty; a prompt needs at least one token", field)
        if len(ids) > max_len:
            raise RequestError(
                f"'{field}' has {len(ids)} tokens but this server's context is {max_len} tokens",
                field,
            )
        out.append(ids)
    return out
