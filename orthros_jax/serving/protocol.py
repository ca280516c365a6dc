"""The OpenAI protocol as typed models: request bodies of /v1/completions and
/v1/chat/completions (and the shape of their answers), so /openapi.json and /docs describe every
field.

Every field is either implemented or refused: models forbid unknown fields (extra='forbid': a
400 naming the field), and the OpenAI fields this server does not implement are declared so the
schema lists them, each refused with a 400 naming it when a client sets it. What depends on the
served model (vocabulary, context length) is checked by `sampling()` against the engine's
limits; every check raises RequestError (or a pydantic ValidationError the API turns into one),
before anything reaches the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from orthros_jax.serving.requests import (
    MAX_LOGIT_BIAS,
    MAX_SEED,
    MAX_STOP_IDS,
    MAX_STOP_STRINGS,
    RequestError,
    SamplingParams,
    check_utf8,
)

MAX_N = 16  # choices per prompt
TokenIds = list[Annotated[int, Field(ge=0)]]
Prompt = str | list[str] | TokenIds | list[TokenIds]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = Field(False, description="A last chunk with the usage counts.")


def _refused(what: str) -> Any:
    return Field(None, description=f"Not implemented by this server: {what}; setting it is a 400.")


class _Sampling(_Strict):
    """The fields both endpoints share."""

    model: str = Field(description="The served model's name (GET /v1/models).")
    max_tokens: int | None = Field(
        None, ge=1, description="Most tokens to generate (default 16; at most the context)."
    )
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0: greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling; 1: off.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0: off (vLLM's).")
    n: int = Field(1, ge=1, le=MAX_N, description="Choices per prompt (choice i: seed + i).")
    seed: int | None = Field(
        None, ge=0, le=MAX_SEED, description="Sampling seed; none: drawn. Choice i uses seed + i."
    )
    stop: str | list[str] | None = Field(
        None, description=f"Up to {MAX_STOP_STRINGS} strings that end the text (not returned)."
    )
    stop_token_ids: list[int] = Field(
        [], max_length=MAX_STOP_IDS, description="Token ids that end the text (vLLM's)."
    )
    stream: bool = Field(False, description="Server-sent events, one chunk per token.")
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="Subtracted from the logit of every generated token."
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="Times its count, subtracted from a generated token."
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        description="Tokens in the prompt or the output: positive logits divided by it, "
        "negative ones multiplied (CTRL / Hugging Face's; vLLM's); 1: off.",
    )
    logit_bias: dict[str, float] | None = Field(
        None,
        description=f"Token id (as a string) -> bias in [-100, 100] added to its logit; at most "
        f"{MAX_LOGIT_BIAS} entries.",
    )
    min_tokens: int = Field(
        0, ge=0, description="End-of-text and stop ids cannot end the text before this many."
    )
    ignore_eos: bool = Field(False, description="Keep generating past end-of-text (vLLM's).")
    user: str | None = Field(
        None, description="An end-user id (OpenAI's); accepted and not used by this server."
    )

    def sampling(
        self, vocab: int, max_len: int, logprobs: int | None, max_tokens_field: str
    ) -> SamplingParams:
        """SamplingParams for the engine, with the checks that need the served model's limits."""
        max_tokens = 16 if self.max_tokens is None else self.max_tokens
        if max_tokens > max_len:
            raise RequestError(
                f"'{max_tokens_field}' must be an integer in [1, {max_len}], got {max_tokens}",
                max_tokens_field,
            )
        if self.min_tokens > max_tokens:
            raise RequestError(
                f"'min_tokens' ({self.min_tokens}) must be at most max_tokens ({max_tokens})",
                "min_tokens",
            )
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_STRINGS or not all(stops):
            raise RequestError(
                f"'stop' must be a non-empty string or at most {MAX_STOP_STRINGS} of them", "stop"
            )
        if any(not 0 <= i < vocab for i in self.stop_token_ids):
            raise RequestError(
                f"'stop_token_ids' must be token ids in [0, {vocab})", "stop_token_ids"
            )
        if self.top_k > vocab:
            raise RequestError(f"'top_k' must be in [0, {vocab}], got {self.top_k}", "top_k")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(check_utf8(s, "stop") for s in stops),
            stop_token_ids=tuple(self.stop_token_ids),
            logprobs=logprobs,
            ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=_logit_bias(self.logit_bias, vocab),
            min_tokens=self.min_tokens,
        )

    def refuse_set(self, names: tuple[str, ...]) -> None:
        """RequestError naming the first of these (declared, unimplemented) fields that is set."""
        for name in names:
            if getattr(self, name) is not None:
                raise RequestError(f"'{name}' is not supported by this server", name)


def _logit_bias(bias: dict[str, float] | None, vocab: int) -> tuple[tuple[int, float], ...]:
    if not bias:
        return ()
    if len(bias) > MAX_LOGIT_BIAS:
        raise RequestError(f"'logit_bias' takes at most {MAX_LOGIT_BIAS} entries", "logit_bias")
    out = []
    for key, value in bias.items():
        if not key.isdigit() or not 0 <= int(key) < vocab:
            raise RequestError(
                f"'logit_bias' keys must be token ids in [0, {vocab}), got {key!r}", "logit_bias"
            )
        if not -100 <= value <= 100:
            raise RequestError(
                f"'logit_bias' values must be in [-100, 100], got {value!r}", "logit_bias"
            )
        out.append((int(key), float(value)))
    return tuple(out)


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Prompt = Field(description="Text, token ids, or a list of either (one choice each).")
    logprobs: int | None = Field(
        None, ge=0, le=5, description="The chosen token's logprob and this many alternatives."
    )
    echo: bool = Field(False, description="Return the prompt in front of the completion.")
    best_of: int | None = Field(
        None, ge=1, description="Only best_of == n is served (every choice returned)."
    )
    suffix: str | None = _refused("text after an insertion")

    def checked(self) -> CompletionRequest:
        self.refuse_set(("suffix",))
        if self.best_of is not None and self.best_of != self.n:
            raise RequestError(
                "'best_of' > n (ranking choices by likelihood) is not supported; use n", "best_of"
            )
        if self.echo and self.logprobs is not None:
            raise RequestError(
                "'echo' with 'logprobs' (the prompt's logprobs) is not supported", "echo"
            )
        return self


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str
    name: str | None = Field(None, description="Passed to the chat template.")


class ResponseFormat(_Strict):
    type: Literal["text"] = Field(description="Only plain text is served.")


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="max_tokens' new name.")
    logprobs: bool = Field(False, description="Return the chosen tokens' logprobs.")
    top_logprobs: int | None = Field(
        None, ge=0, le=5, description="Alternatives per token (with logprobs)."
    )
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = _refused("tool calls")
    tool_choice: Any = _refused("tool calls")
    parallel_tool_calls: bool | None = _refused("tool calls")
    functions: list[dict[str, Any]] | None = _refused("function calls")
    function_call: Any = _refused("function calls")
    audio: dict[str, Any] | None = _refused("audio output")
    modalities: list[str] | None = _refused("output modalities")
    prediction: dict[str, Any] | None = _refused("predicted outputs")
    reasoning_effort: str | None = _refused("reasoning effort")
    web_search_options: dict[str, Any] | None = _refused("web search")

    REFUSED: ClassVar[tuple[str, ...]] = (
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "audio",
        "modalities",
        "prediction",
        "reasoning_effort",
        "web_search_options",
    )

    def checked(self) -> ChatCompletionRequest:
        self.refuse_set(self.REFUSED)
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise RequestError("set one of 'max_tokens' and 'max_completion_tokens'", "max_tokens")
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return self

    def logprobs_n(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def validation_error(e: pydantic.ValidationError | Any) -> RequestError:
    """The first error of a failed body validation as a RequestError naming its field
    (FastAPI's RequestValidationError or pydantic's ValidationError)."""
    err = e.errors()[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    kind = err.get("type", "")
    if kind == "json_invalid":
        return RequestError(f"request body is not valid JSON ({err.get('msg')})", None)
    if kind in ("model_attributes_type", "model_type", "dict_type") and not loc:
        return RequestError("request body must be a JSON object", None)
    if kind == "missing" and not loc:
        return RequestError("a JSON request body is required", None)
    param = loc[0] if loc else None
    where = ".".join(loc)
    if kind == "extra_forbidden":
        return RequestError(f"unknown field '{where}' (not part of this API)", param)
    if kind == "missing":
        return RequestError(f"'{where}' is required", param)
    return RequestError(f"'{where}': {err.get('msg')}, got {_short(err.get('input'))}", param)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."
