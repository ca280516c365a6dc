"""OpenAI-shaped response bodies: completions and chat completions, whole or as stream chunks,
their logprobs, and the error body."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from orthros_jax.serving.engine import Event


def error_body(message: str, param: str | None, status: int, code: str | None = None) -> dict:
    kind = {429: "rate_limit_error", 503: "server_error", 500: "server_error"}.get(
        status, "invalid_request_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Choice:
    """One choice's text, logprobs and end, accumulated from its engine events."""

    def __init__(self, index: int, token_text: Callable[[int], str]) -> None:
        self.index, self.token_text = index, token_text
        self.text = ""
        self.tokens: list[Event] = []
        self.finish_reason: str | None = None
        self.usage = (0, 0)

    def add(self, ev: Event) -> str:
        """Records an event; returns its new text."""
        self.text += ev.text
        if ev.kind == "token" and ev.logprob is not None:
            self.tokens.append(ev)
        if ev.kind == "done":
            self.finish_reason = ev.finish_reason
            self.usage = (ev.prompt_tokens, ev.completion_tokens)
        return ev.text

    def completion_logprobs(self, events: list[Event], offset: int) -> dict:
        """The completions API's logprobs of these token events (text offsets from `offset`)."""
        out: dict[str, list[Any]] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for ev in events:
            assert ev.token is not None  # token events carry their token
            piece = self.token_text(ev.token)
            out["tokens"].append(piece)
            out["token_logprobs"].append(ev.logprob)
            out["top_logprobs"].append({self.token_text(t): lp for t, lp in ev.top or []})
            out["text_offset"].append(offset)
            offset += len(piece)
        return out

    def chat_logprobs(self, events: list[Event]) -> dict:
        def entry(token: int | None, lp: float | None) -> dict:
            assert token is not None  # token events carry their token
            piece = self.token_text(token)
            return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8"))}

        return {
            "content": [
                entry(ev.token, ev.logprob)
                | {"top_logprobs": [entry(t, lp) for t, lp in ev.top or []]}
                for ev in events
            ]
        }


class Formatter:
    """Bodies of one completions (chat=False) or chat completions (chat=True) response."""

    def __init__(self, model: str, chat: bool, logprobs: bool) -> None:
        self.model, self.chat, self.logprobs = model, chat, logprobs
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(choices: list[Choice]) -> dict:
        prompt = sum(c.usage[0] for c in choices)
        done = sum(c.usage[1] for c in choices)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}

    def whole(self, choices: list[Choice]) -> dict:
        out = []
        for c in choices:
            lp = None
            if self.logprobs:
                lp = c.chat_logprobs(c.tokens) if self.chat else c.completion_logprobs(c.tokens, 0)
            if self.chat:
                msg = {"role": "assistant", "content": c.text}
                out.append(
                    {
                        "index": c.index,
                        "message": msg,
                        "logprobs": lp,
                        "finish_reason": c.finish_reason,
                    }
                )
            else:
                out.append(
                    {
                        "index": c.index,
                        "text": c.text,
                        "logprobs": lp,
                        "finish_reason": c.finish_reason,
                    }
                )
        obj = "chat.completion" if self.chat else "text_completion"
        return self._head(obj) | {"choices": out, "usage": self.usage(choices)}

    def chunk(
        self,
        c: Choice,
        text: str,
        events: list[Event],
        offset: int,
        finish: str | None,
        first: bool = False,
    ) -> dict:
        """A stream chunk of choice c: its new text (and the token events behind it)."""
        lp = None
        if self.logprobs and events:
            lp = c.chat_logprobs(events) if self.chat else c.completion_logprobs(events, offset)
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            if finish is not None and not text:
                delta = {}
            body = {"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return self._head("chat.completion.chunk") | {"choices": [body]}
        body = {"index": c.index, "text": text, "logprobs": lp, "finish_reason": finish}
        return self._head("text_completion") | {"choices": [body]}

    def usage_chunk(self, choices: list[Choice]) -> dict:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._head(obj) | {"choices": [], "usage": self.usage(choices)}
