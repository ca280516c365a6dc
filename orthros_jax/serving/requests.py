"""What the engine takes from a request: its sampling settings (SamplingParams) and its prompt
as token ids; RequestError, a bad request naming its field (protocol.py builds both from the
OpenAI request models; the API answers a RequestError with its status and an OpenAI error body).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

MAX_STOP_STRINGS = 4  # as the OpenAI API
MAX_SEED = 2**32 - 1
MAX_STOP_IDS = 15  # stop_token_ids per request (+ the end-of-text id: the engine's stop table)
MAX_LOGIT_BIAS = 300  # logit_bias entries per request (as the OpenAI API)


class RequestError(ValueError):
    """A bad request: `param` names the field, `status` the HTTP status (400 unless set)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One request's settings. temperature 0 is greedy; top_k 0 and top_p 1 are off; seed None
    draws one; logprobs None returns none, n >= 0 the chosen token's and n alternatives.
    presence / frequency penalty (0: off), repetition_penalty (1: off), logit_bias ((token id,
    bias), ...) and min_tokens (0: off) are applied on device (inference/logit_processing.py)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0


def check_request(ids: list[int], params: SamplingParams, max_len: int) -> None:
    """RequestError (400) unless ids is a prompt of 1 to max_len tokens and the stop ids fit
    the engine's stop table."""
    if not ids or len(ids) > max_len:
        raise RequestError(f"prompt must have 1 to {max_len} tokens, got {len(ids)}", "prompt")
    if len(params.stop_token_ids) > MAX_STOP_IDS:
        raise RequestError(f"at most {MAX_STOP_IDS} stop_token_ids", "stop_token_ids")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_utf8(text: str, field: str) -> str:
    """text if it is valid Unicode that encodes to UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"'{field}' is not valid UTF-8 text ({e.reason})", field) from None
    return text


def prompt_ids(
    prompt: Any,
    encode: Callable[[str], list[int]],
    vocab_size: int,
    max_len: int,
    field: str = "prompt",
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
