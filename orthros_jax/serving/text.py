"""Incremental detokenization with stop strings: the text a request may show so far.

A stream shows text as tokens arrive but holds back (a) a trailing U+FFFD, which may be half
of a multi-byte character, and (b) a tail that could be the start of a stop string; when a
stop string appears the text ends right before it (the stop string is not part of the output,
as in the OpenAI API).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """Text of the tokens added so far, in deltas that never need to be taken back."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str] = ()) -> None:
        self.decode, self.stops = decode, tuple(stops)
        self.ids: list[int] = []
        self.shown = ""
        self.stopped = False
        self._longest = max((len(s) for s in self.stops), default=0)

    def add(self, token: int) -> str:
        """Adds a token; returns the newly shown text. Sets .stopped at a stop string."""
        self.ids.append(int(token))
        text = self.decode(self.ids)
        if self.stops:
            start = max(0, len(self.shown) - self._longest)
            hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.stopped = True
                return self._show(text[: min(hits)])
        safe = text.rstrip("\ufffd")
        hold = 0
        for s in self.stops:  # the longest tail of safe that begins some stop string
            for k in range(min(len(s) - 1, len(safe)), hold, -1):
                if safe.endswith(s[:k]):
                    hold = k
                    break
        return self._show(safe[: len(safe) - hold])

    def finish(self) -> str:
        """The rest of the text once no token follows (nothing held back)."""
        if self.stopped:
            return ""
        return self._show(self.decode(self.ids))

    def _show(self, text: str) -> str:
        # Deltas are only ever appended: a decoder that revises earlier text (rare; not bytes)
        # shows just what lies beyond the text already shown.
        delta = text[len(self.shown) :]
        self.shown += delta
        return delta
