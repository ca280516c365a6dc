"""Synthetic recall tasks, generated on the fly: multi-query associative recall and passkey.

Both build sequences in token space (so lengths are exact for any tokenizer; with bytes,
vocab 256, everything is ASCII) and know where every answer is, so answers are correct
by construction. An example is a `RecallExample`: the whole token sequence plus the
[start, end) span of each answer. It serves both uses:

* SFT training rows (`sft.sft_element`): loss and output copies only on answer tokens;
* evaluation: `example.queries()` gives (prompt, answer) pairs for greedy decoding, and
  `example.answer_mask` marks the answer tokens for teacher-forced argmax scoring.

MQAR (`task="mqar"`): `n_pairs` pairs " key=value " (4 lowercase letters, 4 digits) sit
at random places in filler in the first part of the context; after a gap of at least
`gap` filler tokens come `n_queries` distinct queries " key=" each followed by its value:

    [filler p0 filler p1 ... p_{n-1} filler][gap filler][ key=VALUE key=VALUE ...]

Every queried pair is >= gap tokens before every query, so a model whose attention
window is <= gap cannot see it locally.

Passkey / needle-in-a-haystack (`task="passkey"`): a needle " The pass key is 48213.
Remember it. 48213 is the pass key. " is inserted at `depth` (fraction of the haystack)
into filler; the sequence ends with "\\nWhat is the pass key? The pass key is " and the
5-digit answer. `grid()` covers context lengths x depths.

Filler: "fixed" (the classic passkey sentences) or "pydoc" (pydoc topics prose); '=' and
digits are removed from filler so the only key=value / digit strings are the task's.
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Sequence

import numpy as np

from orthros_jax.data.corpus import pydoc_text
from orthros_jax.data.tokenizers import Tokenizer

TASKS: tuple[str, ...] = ("mqar", "passkey")
FIXED_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is "
# Streams keep training and evaluation examples apart for the same seed.
TRAIN_STREAM, EVAL_STREAM = 0, 1
_FILLER_BAN = re.compile(r"[=0-9]")


@dataclasses.dataclass(frozen=True)
class RecallExample:
    """One generated sequence. tokens [L] int32; answer_spans: [start, end) per answer."""

    tokens: np.ndarray
    answer_spans: tuple[tuple[int, int], ...]
    task: str
    context_len: int
    depth: float  # passkey: needle depth in [0, 1]; mqar: mean relative position of queried pairs
    distance: int  # tokens from the end of the nearest queried item to the first answer

    @property
    def prompt(self) -> np.ndarray:
        """Tokens before the last answer [P] (includes earlier queries and their answers)."""
        return self.tokens[: self.answer_spans[-1][0]]

    @property
    def answer(self) -> np.ndarray:
        """The last answer's tokens [A]."""
        start, end = self.answer_spans[-1]
        return self.tokens[start:end]

    def queries(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(prompt, answer) per answer, for greedy decoding; earlier answers stay in the prompt."""
        return [(self.tokens[:s], self.tokens[s:e]) for s, e in self.answer_spans]

    @property
    def answer_mask(self) -> np.ndarray:
        """[L] bool, True on answer tokens (the ones a model must predict)."""
        mask = np.zeros(len(self.tokens), bool)
        for s, e in self.answer_spans:
            mask[s:e] = True
        return mask


class RecallTask:
    """A generator of one task's examples for one tokenizer.

    context_len: total tokens of an example (prompt and answers). Shapes are checked on
    construction (ValueError naming the DataConfig field to change).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        task: str,
        *,
        context_len: int,
        n_pairs: int = 8,
        n_queries: int = 4,
        gap: int = 128,
        filler: str = "fixed",
        key_len: int = 4,
        value_len: int = 4,
        passkey_digits: int = 5,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"recall task {task!r} is unknown; allowed: {', '.join(TASKS)}")
        if n_queries > n_pairs:
            raise ValueError(
                f"DataConfig.recall_queries={n_queries} must be <= recall_pairs={n_pairs}"
            )
        self.tok, self.task = tokenizer, task
        self.context_len, self.n_pairs, self.n_queries, self.gap = (
            context_len,
            n_pairs,
            n_queries,
            gap,
        )
        self.key_len, self.value_len, self.passkey_digits = key_len, value_len, passkey_digits
        if filler == "fixed":
            text = FIXED_FILLER
        elif filler == "pydoc":
            text = pydoc_text()
        else:
            raise ValueError(
                f"DataConfig.recall_filler={filler!r} is unknown; allowed: fixed, pydoc"
            )
        self.filler_ids = self._encode(_FILLER_BAN.sub("", text))
        self.question_ids = self._encode(PASSKEY_QUESTION)
        self.check(context_len)

    def _encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text), np.int32)

    def _filler(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n filler tokens starting at a random phase of the (tiled) filler text."""
        start = int(rng.integers(len(self.filler_ids)))
        return self.filler_ids[(start + np.arange(n)) % len(self.filler_ids)]

    def _needle(self, key: str) -> np.ndarray:
        return self._encode(f" The pass key is {key}. Remember it. {key} is the pass key. ")

    def min_context(self) -> int:
        """Smallest context_len an example fits in (byte-exact for fixed-length pieces)."""
        if self.task == "passkey":
            key = "0" * self.passkey_digits
            return len(self._needle(key)) + len(self.question_ids) + len(self._encode(key))
        pair = len(self._encode(f" {'a' * self.key_len}={'0' * self.value_len} "))
        query = len(self._encode(f" {'a' * self.key_len}=")) + len(
            self._encode("0" * self.value_len)
        )
        return self.n_pairs * pair + self.gap + self.n_queries * query

    def check(self, context_len: int) -> None:
        need = self.min_context()
        if context_len < need:
            detail = (
                f"recall_pairs={self.n_pairs}, recall_queries={self.n_queries}, "
                f"recall_gap={self.gap}"
                if self.task == "mqar"
                else "the needle and question"
            )
            raise ValueError(
                f"DataConfig.recall_context (or seq_len)={context_len} "
                f"is too short for {self.task} "
                f"with {detail}: needs >= {need} tokens"
            )

    def answer_len(self) -> int:
        """Answer tokens per example (the SFT rows' output copies); exact for bytes."""
        if self.task == "passkey":
            return len(self._encode("0" * self.passkey_digits))
        return self.n_queries * len(self._encode("0" * self.value_len))

    def sample(self, seed: int, index: int, stream: int = TRAIN_STREAM) -> RecallExample:
        """Example `index` of a seed's stream: a pure function of (seed, stream, index)."""
        rng = np.random.default_rng([seed, stream, index])
        return self.example(rng)

    def example(
        self,
        rng: np.random.Generator,
        *,
        context_len: int | None = None,
        depth: float | None = None,
    ) -> RecallExample:
        """A random example of exactly context_len tokens (default: the task's)."""
        context_len = self.context_len if context_len is None else context_len
        self.check(context_len)
        if self.task == "passkey":
            return self._passkey(rng, context_len, rng.uniform() if depth is None else depth)
        return self._mqar(rng, context_len)

    def grid(
        self, context_lengths: Sequence[int], depths: Sequence[float], samples: int, seed: int
    ) -> list[RecallExample]:
        """Evaluation examples over context lengths x depths (depth ignored by mqar), `samples`
        each."""
        out = []
        for ci, length in enumerate(context_lengths):
            for di, depth in enumerate(depths if self.task == "passkey" else [0.0]):
                for s in range(samples):
                    rng = np.random.default_rng([seed, EVAL_STREAM, 1 + ci, di, s])
                    out.append(self.example(rng, context_len=int(length), depth=float(depth)))
        return out

    def _passkey(self, rng: np.random.Generator, context_len: int, depth: float) -> RecallExample:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"passkey depth must be in [0, 1], got {depth}")
        key = "".join(rng.choice(list(string.digits), self.passkey_digits))
        needle, answer = self._needle(key), self._encode(key)
        hay = self._filler(rng, context_len - len(needle) - len(self.question_ids) - len(answer))
        at = int(round(depth * len(hay)))
        tokens = np.concatenate([hay[:at], needle, hay[at:], self.question_ids, answer])
        start = len(tokens) - len(answer)
        return RecallExample(
            tokens=tokens.astype(np.int32),
            answer_spans=((start, len(tokens)),),
            task="passkey",
            context_len=context_len,
            depth=depth,
            distance=start - (at + len(needle)),
        )

    def _mqar(self, rng: np.random.Generator, context_len: int) -> RecallExample:
        keys: list[str] = []
        while len(keys) < self.n_pairs:  # distinct keys; 26**4 makes retries rare
            key = "".join(rng.choice(list(string.ascii_lowercase), self.key_len))
            if key not in keys:
                keys.append(key)
        values = ["".join(rng.choice(list(string.digits), self.value_len)) for _ in keys]
        pairs = [self._encode(f" {k}={v} ") for k, v in zip(keys, values, strict=True)]
        asked = rng.permutation(self.n_pairs)[: self.n_queries]
        queries = [(self._encode(f" {keys[i]}="), self._encode(values[i])) for i in asked]
        q_len = sum(len(q) + len(a) for q, a in queries)
        free = context_len - q_len - self.gap - sum(len(p) for p in pairs)
        if free < 0:  # only possible with a tokenizer whose pieces are longer than estimated
            raise ValueError(
                f"DataConfig.recall_context={context_len} too short for mqar with this tokenizer"
            )
        # Random filler between pairs: n_pairs cut points in the `free` filler tokens.
        cuts = np.sort(rng.integers(0, free + 1, size=self.n_pairs))
        filler = self._filler(rng, free + self.gap)
        pieces, pair_end, prev = [], [], 0
        length = 0
        for cut, pair in zip(cuts, pairs, strict=True):
            pieces += [filler[prev:cut], pair]
            length += int(cut - prev) + len(pair)
            pair_end.append(length)
            prev = int(cut)
        pieces.append(filler[prev:])
        length += len(filler) - prev
        spans = []
        for q, a in queries:
            pieces += [q, a]
            spans.append((length + len(q), length + len(q) + len(a)))
            length += len(q) + len(a)
        tokens = np.concatenate(pieces).astype(np.int32)
        first_answer = spans[0][0]
        return RecallExample(
            tokens=tokens,
            answer_spans=tuple(spans),
            task="mqar",
            context_len=context_len,
            depth=float(np.mean([pair_end[i] / context_len for i in asked])),
            distance=first_answer - max(pair_end[i] for i in asked),
        )
