"""Chat templates: a model's Jinja chat template (Hugging Face's tokenizer_config.json
"chat_template") rendered in a sandbox, turning messages into the prompt text."""

from __future__ import annotations

import json
import os
from typing import Any

from orthros_jax.serving.requests import RequestError

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplate:
    """template: the Jinja source. render(messages) -> prompt text (generation prompt added)."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(template)
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: Any) -> str:
        if not isinstance(messages, list) or not messages:
            raise RequestError(
                "'messages' must be a non-empty list of {role, content} objects", "messages"
            )
        for m in messages:
            if (
                not isinstance(m, dict)
                or m.get("role") not in ROLES
                or not isinstance(m.get("content"), str)
            ):
                raise RequestError(
                    f"each message needs a 'role' in {ROLES} and a string 'content', got {m!r}"[
                        :300
                    ],
                    "messages",
                )
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except RequestError:
            raise
        except Exception as e:  # a template error is about these messages, not the server
            raise RequestError(
                f"the chat template failed on these messages: {e}", "messages"
            ) from None


def _raise(message: str) -> None:
    raise RequestError(f"chat template: {message}", "messages")


def load_chat_template(
    tokenizer_file: str | None, override: str | None = None
) -> ChatTemplate | None:
    """The template of a file given (`override`: a .jinja file, or a tokenizer_config.json), else
    of the tokenizer_config.json beside the model's tokenizer.json; None when there is none."""
    path = override
    if path is None and tokenizer_file:
        path = os.path.join(os.path.dirname(tokenizer_file), "tokenizer_config.json")
    if path is None or not os.path.isfile(path):
        if override is not None:
            raise ValueError(f"--chat_template file {override!r} does not exist")
        return None
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not path.endswith(".json"):
        return ChatTemplate(text)
    meta = json.loads(text)
    template = meta.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not template:
        return None

    def token(name: str) -> str:
        t = meta.get(name) or ""
        return t.get("content", "") if isinstance(t, dict) else t

    return ChatTemplate(template, token("bos_token"), token("eos_token"))
