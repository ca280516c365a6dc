"""Prefix caching: which token ids each cache row holds, and a new request admitted with the
longest prefix some row already holds.

`PrefixIndex` mirrors every row of the engine's cache on the host: `ids[r]` are exactly the
tokens whose state row r holds (positions 0 .. len - 1; prefill chunks and fed decode tokens are
appended as the device writes them), for running rows and for free rows whose request finished
(their state stays until the row is taken). Positions below a running row's length never
change, so any row's prefix can be read at any step.

A new request's prompt P is matched against every row: the longest common prefix L (at most
len(P) - 1: the last prompt token is always prefilled, for its logits). Attention-only models
reuse any L; a model with recurrent kinds (gdn / gla / retention) holds its state only at the
row's full length, so it reuses a row only when P starts with all of that row's tokens (e.g.
the whole previous turn of a chat). The request gets a free row: the matched row itself when
it is free (reused in place: its length is cut to L), else the least recently used free row,
into which `copy_prefix` copies the matched row's state and sets the length to L; the prefill
then continues from L. The penalties' history row is rebuilt for the prefix (in_prompt = its
tokens, no outputs). A row is never read by another request after it is taken, and no running
row's tokens below its length change, so a request never sees another's text.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.inference import logit_processing as lp
from orthros_jax.inference.cache import KVCache
from orthros_jax.inference.sampling import Sampled
from orthros_jax.layers.registry import kinds_of
from orthros_jax.serving.device import gather_rows, scatter_rows


@dataclasses.dataclass(frozen=True)
class Match:
    """Row `dst` gets the first `length` tokens of row `src` (src == dst: in place)."""

    src: int
    dst: int
    length: int


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if diff.size else n


class PrefixIndex:
    """The host's record of every row's tokens, and the lookup (module docstring)."""

    def __init__(self, cfg: ModelConfig, rows: int) -> None:
        self.any_prefix = not any(k.recurrent for k in kinds_of(cfg))
        self.ids: list[list[int]] = [[] for _ in range(rows)]
        self.used = [0] * rows  # last admission or append tick: LRU among free rows
        self._tick = 0

    def touch(self, row: int) -> None:
        self._tick += 1
        self.used[row] = self._tick

    def append(self, row: int, tokens: list[int]) -> None:
        self.ids[row].extend(tokens)
        self.touch(row)

    def clear(self) -> None:
        for r in range(len(self.ids)):
            self.ids[r] = []

    def lookup(self, prompt: list[int], free: list[int]) -> Match:
        """The row the prompt gets (one of `free`) and the prefix it reuses (length 0: none)."""
        best, best_len = -1, 0
        for r, held in enumerate(self.ids):
            n = min(_lcp(prompt, held), len(prompt) - 1)
            if not self.any_prefix and n < len(held):
                n = 0  # a recurrent state exists only at the row's whole length
            if n > best_len or (n == best_len and n > 0 and r in free and best not in free):
                best, best_len = r, n
        if best_len > 0 and best in free:
            return Match(best, best, best_len)
        dst = min(free, key=lambda r: self.used[r])
        return Match(best if best_len > 0 else dst, dst, best_len)

    def take(self, m: Match) -> None:
        """Row m.dst now holds the first m.length tokens of row m.src."""
        self.ids[m.dst] = self.ids[m.src][: m.length]
        self.touch(m.dst)

    def admit(
        self, prompt: list[int], free: list[int], cache: KVCache, hist: lp.History, cfg: ModelConfig
    ) -> tuple[int, int, KVCache, lp.History]:
        """(row, reused tokens, cache, hist) for a new request: the lookup's row, holding the
        matched prefix (copy_prefix; nothing to do without one: its prefill resets the row)."""
        m = self.lookup(prompt, free)
        if m.length:
            cache, hist = copy_prefix(
                cache,
                hist,
                np.int32(m.src),
                np.int32(m.dst),
                np.int32(m.length),
                prefix_tokens(prompt, m.length, cache.max_len),
                cfg=cfg,
            )
        self.take(m)
        return m.dst, m.length, cache, hist

    def record_decode(self, last: dict[int, int], sampled: Sampled, fed: np.ndarray) -> None:
        """Appends what a decode call fed each row (last[row]: its first feed; step k > 0
        fed step k - 1's draw; fed [K, B]: whether step k ran on the row)."""
        for i, first in last.items():
            ids = [first, *np.asarray(sampled.tokens)[:-1, i].tolist()]
            self.append(i, [t for t, f in zip(ids, fed[:, i], strict=True) if f])


def _copy_prefix(
    cache: KVCache,
    hist: lp.History,
    src: jax.Array,
    dst: jax.Array,
    length: jax.Array,
    prefix_S: jax.Array,
    *,
    cfg: ModelConfig,
) -> tuple[KVCache, lp.History]:
    """cache with row dst = row src's state at length `length`; hist row dst emptied with
    in_prompt = prefix_S[:length] (prefix_S: [S] token ids, zero padded)."""
    row = gather_rows(cfg, cache, src[None])
    row = row.replace(lengths=jnp.minimum(row.lengths, length))
    cache = scatter_rows(cfg, cache, dst[None], row)
    sub = lp.record_prompt(
        lp.gather(hist, dst[None]), prefix_S[None], length[None], jnp.ones((1,), bool)
    )
    return cache, lp.scatter(hist, dst[None], sub)


copy_prefix = jax.jit(_copy_prefix, static_argnames=("cfg",), donate_argnames=("cache", "hist"))


@functools.lru_cache(maxsize=8)
def _zeros(n: int) -> np.ndarray:
    return np.zeros((n,), np.int32)


def prefix_tokens(ids: list[int], length: int, max_len: int) -> np.ndarray:
    """[max_len] int32: the first `length` ids, zero padded (copy_prefix's prefix_S)."""
    out = _zeros(max_len).copy()
    out[:length] = ids[:length]
    return out
