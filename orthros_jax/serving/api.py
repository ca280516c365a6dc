"""The OpenAI-compatible HTTP app (FastAPI) over an Engine.

    POST /v1/completions       protocol.CompletionRequest: prompt (text, token ids, or a list of
                               either), n choices each, echo, stream (SSE), logprobs, penalties...
    POST /v1/chat/completions  protocol.ChatCompletionRequest, when the model has a chat template
                               (400 otherwise)
    GET  /v1/models, /health, /metrics (Prometheus text); /openapi.json and /docs describe them

Request bodies are typed models (protocol.py): FastAPI validates them, and every failure (bad
JSON, a wrong type, an unknown or unsupported field) is an HTTP 400 with an OpenAI-style error
body naming the field (never FastAPI's 422); a full queue is 429, a server that drains 503.
The engine runs on its own thread: its events cross to the event loop with
call_soon_threadsafe. A stream whose client goes away cancels its requests (the slots are free
at the next engine step); the app's shutdown drains the engine (uvicorn's SIGTERM handling).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from orthros_jax.serving.chat import ChatTemplate
from orthros_jax.serving.engine import Engine, Event
from orthros_jax.serving.events import Request as EngineRequest
from orthros_jax.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    validation_error,
)
from orthros_jax.serving.requests import RequestError, SamplingParams, check_utf8, prompt_ids
from orthros_jax.serving.responses import Choice, Formatter, error_body

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 << 20
POLL_S = 0.25  # how often a waiting handler checks that its client is still there
RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Invalid request: an OpenAI error body naming the field"},
    429: {"description": "The queue is full"},
    503: {"description": "The server is draining"},
}


def _error(e: RequestError) -> JSONResponse:
    code = "model_not_found" if e.param == "model" else None
    return JSONResponse(error_body(e.message, e.param, e.status, code), status_code=e.status)


def choice_params(sp: SamplingParams, n: int) -> list[SamplingParams]:
    """The settings of n choices of a prompt: choice i samples with seed + i (mod 2**32)."""
    if sp.seed is None:
        return [sp] * n  # the engine draws a seed per request
    return [dataclasses.replace(sp, seed=(sp.seed + i) % 2**32) for i in range(n)]


def create_app(
    engine: Engine, tokenizer: Any, model_name: str, chat_template: ChatTemplate | None = None
) -> FastAPI:
    """The app serving `engine` as model `model_name`. tokenizer: encode/decode (the engine's
    decode_text should be its decode). The engine is started with the app and drained when it
    stops."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not engine.running:
            engine.start()
        yield
        # uvicorn got SIGTERM/SIGINT (or the app is closing): finish what runs, then stop.
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, True)

    app = FastAPI(title="orthros-jax", lifespan=lifespan)
    vocab = getattr(tokenizer, "vocab_size", engine.cfg.vocab_size)
    vocab = min(vocab, engine.cfg.vocab_size)
    token_text = lambda t: tokenizer.decode([t])

    @app.exception_handler(RequestError)
    async def _request_error(request: Request, e: RequestError) -> JSONResponse:
        return _error(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return _error(validation_error(e))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        # Starlette's own refusals (a body it cannot parse: not UTF-8; an unknown route...).
        message = "request body is not valid UTF-8 JSON" if e.status_code == 400 else str(e.detail)
        return _error(RequestError(message, None, e.status_code))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(
            error_body(f"internal error: {type(e).__name__}", None, 500), status_code=500
        )

    @app.middleware("http")
    async def _limits(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        size = request.headers.get("content-length", "0")
        if not size.isdigit() or int(size) > MAX_BODY_BYTES:
            return _error(RequestError(f"request body over {MAX_BODY_BYTES} bytes", None, 413))
        return await call_next(request)

    def check_model(name: str) -> None:
        if name != model_name:
            raise RequestError(
                f"unknown model {name!r}; this server serves {model_name!r}", "model"
            )

    async def run(
        request: Request,
        req: CompletionRequest | ChatCompletionRequest,
        prompts: list[list[int]],
        sp: SamplingParams,
        echo: list[str] | None,
    ) -> Response:
        chat = isinstance(req, ChatCompletionRequest)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        reqs = []
        jobs = [(ids, p) for ids in prompts for p in choice_params(sp, req.n)]
        try:
            for i, (ids, p) in enumerate(jobs):
                cb = lambda ev, i=i: loop.call_soon_threadsafe(queue.put_nowait, (i, ev))
                reqs.append(engine.submit(ids, p, cb))
        except RequestError:
            for r in reqs:
                engine.cancel(r)
            raise
        fmt = Formatter(model_name, chat, sp.logprobs is not None)
        choices = [Choice(i, token_text) for i in range(len(jobs))]
        prefix = [echo[i // req.n] for i in range(len(jobs))] if echo else None
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            gen = _stream(request, engine, reqs, queue, fmt, choices, include_usage, prefix)
            return StreamingResponse(gen, media_type="text/event-stream")
        for c, text in zip(choices, prefix or [], strict=False):
            c.text = text
        try:
            left = len(jobs)
            while left:
                i, ev = await _next(request, queue)
                if ev.kind == "error":
                    raise RequestError(f"generation failed: {ev.error}", None, status=500)
                choices[i].add(ev)
                left -= ev.kind == "done"
        finally:
            for r in reqs:
                engine.cancel(r)  # no-op for finished ones; frees the slots of a lost client
        return JSONResponse(fmt.whole(choices))

    @app.post("/v1/completions", responses=RESPONSES)
    async def completions(request: Request, body: CompletionRequest) -> Response:
        """OpenAI completions: text of each prompt (n choices each), whole or streamed."""
        check_model(body.model)
        body.checked()
        prompts = prompt_ids(body.prompt, tokenizer.encode, vocab, engine.max_len)
        sp = body.sampling(vocab, engine.max_len, body.logprobs, "max_tokens")
        echo = [tokenizer.decode(ids) for ids in prompts] if body.echo else None
        return await run(request, body, prompts, sp, echo)

    @app.post("/v1/chat/completions", responses=RESPONSES)
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        """OpenAI chat completions over the model's chat template (n choices), whole or streamed."""
        check_model(body.model)
        body.checked()
        if chat_template is None:
            raise RequestError(
                f"model {model_name!r} has no chat template (tokenizer_config.json "
                "'chat_template'); use /v1/completions",
                "messages",
            )
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        text = chat_template.render(messages)
        prompts = prompt_ids(
            check_utf8(text, "messages"), tokenizer.encode, vocab, engine.max_len, "messages"
        )
        field = "max_tokens" if "max_tokens" in body.model_fields_set else "max_completion_tokens"
        sp = body.sampling(vocab, engine.max_len, body.logprobs_n(), field)
        return await run(request, body, prompts, sp, None)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "orthros-jax",
            "max_model_len": engine.max_len,
        }
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Any:
        if engine.closed:
            return JSONResponse({"status": "draining"}, status_code=503)
        return {
            "status": "ok",
            "active_slots": engine.metrics.active_slots,
            "queue_depth": engine.metrics.queue_depth,
        }

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    return app


async def _next(request: Request, queue: asyncio.Queue) -> tuple[int, Event]:
    """The next engine event; raises CancelledError when the client has gone."""
    while True:
        try:
            return await asyncio.wait_for(queue.get(), POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                raise asyncio.CancelledError("client disconnected") from None


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _stream(
    request: Request,
    engine: Engine,
    reqs: list[EngineRequest],
    queue: asyncio.Queue,
    fmt: Formatter,
    choices: list[Choice],
    include_usage: bool,
    echo: list[str] | None,
) -> AsyncIterator[str]:
    """Server-sent events: each choice's echoed prompt (echo), one chunk per token with text, a
    last chunk per choice with its finish_reason, [DONE]. An engine error ends the stream with
    an error event."""
    offsets, started = [0] * len(choices), [False] * len(choices)
    pending: list[list[Event]] = [[] for _ in choices]
    try:
        for i, text in enumerate(echo or []):
            yield _sse(fmt.chunk(choices[i], text, [], 0, None, first=True))
            started[i], offsets[i] = True, len(text)
        left = len(choices)
        while left:
            i, ev = await _next(request, queue)
            c = choices[i]
            if ev.kind == "error":
                yield _sse(error_body(f"generation failed: {ev.error}", None, 500))
                return
            text = c.add(ev)
            if ev.kind == "token" and ev.logprob is not None:
                pending[i].append(ev)
            finish = ev.finish_reason if ev.kind == "done" else None
            if text or finish is not None or (pending[i] and fmt.logprobs):
                yield _sse(fmt.chunk(c, text, pending[i], offsets[i], finish, first=not started[i]))
                started[i] = True
                offsets[i] += sum(len(c.token_text(e.token or 0)) for e in pending[i])
                pending[i] = []
            left -= ev.kind == "done"
        if include_usage:
            yield _sse(fmt.usage_chunk(choices))
        yield "data: [DONE]\n\n"
    finally:
        for r in reqs:
            engine.cancel(r)
