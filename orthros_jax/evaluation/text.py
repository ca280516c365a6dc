"""Text <-> ids for the harness model, with the special tokens lm-evaluation-harness expects.

A model directory's tokenizer.json is used as Hugging Face uses it: `add_special_tokens=True`
runs its post-processor (Llama: BOS first). The BOS id is read off that post-processor (the
special tokens it adds to an empty string); EOS is found by name (data.tokenizers). Without a
tokenizer.json the model reads UTF-8 bytes and has no special tokens at all.
"""

from __future__ import annotations

import os

from orthros_jax.data.tokenizers import ByteTokenizer, HFTokenizer

NEWLINE_ID = 10  # bytes: the document boundary of our byte corpora stands in for end-of-text


class HarnessTokenizer:
    """encode / decode with optional special tokens; bos_id, eos_id (None when absent) and
    eot_id (EOS, or the newline id when the tokenizer has no EOS)."""

    def __init__(self, tokenizer_file: str | None, eos_token: str | None = None) -> None:
        self._bytes: ByteTokenizer | None = None
        self._tok = None
        self.bos_id: int | None = None
        if not tokenizer_file:
            self._bytes = ByteTokenizer()
            self.vocab_size = self._bytes.vocab_size
            self.eos_id: int | None = None
            self.name = "bytes"
            self.eot_id = NEWLINE_ID
            return
        hf = HFTokenizer(tokenizer_file, eos_token=eos_token)  # validates the path, finds EOS
        self._tok = hf._tok  # its loaded `tokenizers.Tokenizer`: the file is parsed once
        # HFTokenizer falls back to a common EOS name when eos_token is unknown: ask directly.
        if eos_token is not None and self._tok.token_to_id(eos_token) is None:
            raise ValueError(f"eos_token={eos_token!r} is not a token of {tokenizer_file}")
        self.vocab_size = hf.vocab_size
        self.eos_id = hf.eos_id
        self.name = os.path.abspath(tokenizer_file)
        added = self._tok.encode("", add_special_tokens=True).ids
        self.bos_id = added[0] if added else None
        newline = self._tok.encode("\n", add_special_tokens=False).ids
        self.eot_id = self.eos_id if self.eos_id is not None else (newline or [0])[-1]

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self._bytes is not None:
            return self._bytes.encode(text)
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        if self._bytes is not None:
            return self._bytes.decode(ids)
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
