"""The OpenAI-compatible HTTP app (FastAPI) over an Engine.

    POST /v1/completions       prompt (text, token ids, or a list of either), max_tokens,
                               temperature, top_p, top_k, seed, stop, stream (SSE), logprobs
    POST /v1/chat/completions  messages, when the model has a chat template (400 otherwise)
    GET  /v1/models, /health, /metrics (Prometheus text)

Request bodies are parsed and checked here (requests.py), so every bad input is an HTTP 400
with an OpenAI-style error body naming the field; a full queue is 429, a server that drains
503. The engine runs on its own thread: its events cross to the event loop with
call_soon_threadsafe. A stream whose client goes away cancels its request (the slot is free at
the next engine step); the app's shutdown drains the engine (uvicorn's SIGTERM handling).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from orthros_jax.inference.sampling import TOP_LOGPROBS
from orthros_jax.serving.chat import ChatTemplate
from orthros_jax.serving.engine import Engine, Event
from orthros_jax.serving.events import Request as EngineRequest
from orthros_jax.serving.requests import (
    RequestError,
    SamplingParams,
    check_utf8,
    prompt_ids,
    sampling_params,
)
from orthros_jax.serving.responses import Choice, Formatter, error_body

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 << 20
POLL_S = 0.25  # how often a waiting handler checks that its client is still there


def _error(e: RequestError) -> JSONResponse:
    code = "model_not_found" if e.param == "model" else None
    return JSONResponse(error_body(e.message, e.param, e.status, code), status_code=e.status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise RequestError(f"request body over {MAX_BODY_BYTES} bytes", None, status=413)
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RequestError("request body is not valid UTF-8", None) from None
    except json.JSONDecodeError as e:
        raise RequestError(f"request body is not valid JSON ({e.msg})", None) from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", None)
    return body


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

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(
            error_body(f"internal error: {type(e).__name__}", None, 500), status_code=500
        )

    def check_model(body: dict) -> None:
        name = body.get("model")
        if not isinstance(name, str):
            raise RequestError("'model' is required: the served model's name", "model")
        if name != model_name:
            raise RequestError(
                f"unknown model {name!r}; this server serves {model_name!r}", "model"
            )

    def params_of(body: dict) -> SamplingParams:
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("'stream' must be a boolean", "stream")
        return sampling_params(body, vocab, engine.max_len, TOP_LOGPROBS)

    async def run(request: Request, body: dict, prompts: list[list[int]], chat: bool) -> Response:
        sp = params_of(body)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        reqs = []
        try:
            for i, ids in enumerate(prompts):
                cb = lambda ev, i=i: loop.call_soon_threadsafe(queue.put_nowait, (i, ev))
                reqs.append(engine.submit(ids, sp, cb))
        except RequestError:
            for r in reqs:
                engine.cancel(r)
            raise
        fmt = Formatter(model_name, chat, sp.logprobs is not None)
        choices = [Choice(i, token_text) for i in range(len(prompts))]
        if body.get("stream", False):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            gen = _stream(request, engine, reqs, queue, fmt, choices, include_usage)
            return StreamingResponse(gen, media_type="text/event-stream")
        try:
            left = len(prompts)
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

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _body(request)
        check_model(body)
        if "prompt" not in body:
            raise RequestError("'prompt' is required", "prompt")
        prompts = prompt_ids(body["prompt"], tokenizer.encode, vocab, engine.max_len)
        return await run(request, body, prompts, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _body(request)
        check_model(body)
        if chat_template is None:
            raise RequestError(
                f"model {model_name!r} has no chat template (tokenizer_config.json "
                "'chat_template'); use /v1/completions",
                "messages",
            )
        text = chat_template.render(body.get("messages"))
        prompts = prompt_ids(
            check_utf8(text, "messages"), tokenizer.encode, vocab, engine.max_len, "messages"
        )
        return await run(request, body, prompts, chat=True)

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "orthros-jax",
                "max_model_len": engine.max_len}  # fmt: skip
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


async def _stream(request: Request, engine: Engine, reqs: list[EngineRequest], queue: asyncio.Queue,
                  fmt: Formatter, choices: list[Choice], include_usage: bool) -> AsyncIterator[str]:  # fmt: skip
    """Server-sent events: one chunk per token with text, a last chunk per choice with its
    finish_reason, [DONE]. An engine error ends the stream with an error event."""
    offsets, started = [0] * len(choices), [False] * len(choices)
    pending: list[list[Event]] = [[] for _ in choices]
    try:
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
