"""Tokenizers: raw UTF-8 bytes by default, a Hugging Face `tokenizer.json` when given."""

from __future__ import annotations

import os
from typing import Protocol


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255. No special tokens; undecodable bytes become U+FFFD."""

    vocab_size = 256
    eos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizers` tokenizer loaded from a local tokenizer.json (nothing is downloaded)."""

    def __init__(self, path: str, eos_token: str | None = None) -> None:
        from tokenizers import Tokenizer as _HF

        if not os.path.isfile(path):
            raise ValueError(f"tokenizer file {path!r} does not exist (expected a tokenizer.json)")
        self.path = path
        self._tok = _HF.from_file(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = None
        for name in (eos_token, "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"):
            if name is not None and self._tok.token_to_id(name) is not None:
                self.eos_id = self._tok.token_to_id(name)
                break

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """encode() of many texts at once (parallel in the Rust tokenizer)."""
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def load_tokenizer(path: str | None) -> Tokenizer:
    """Bytes when path is None or empty, else the tokenizer.json at path."""
    if not path:
        return ByteTokenizer()
    return HFTokenizer(path)
