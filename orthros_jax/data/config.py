"""DataConfig: everything that fixes a data pipeline (corpus, tokenizer, shapes, seed, task).

Launchers build it from an `ml_collections` config with `DataConfig.from_dict`, which
rejects unknown keys by name. Every error a user can cause is a `ValueError` that names
the field.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

KINDS: tuple[str, ...] = ("pt", "sft")
SFT_TASKS: tuple[str, ...] = ("docstring", "mqar", "passkey")
FILLERS: tuple[str, ...] = ("fixed", "pydoc")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """A data pipeline. Shapes: B = batch_size (global), T = seq_len, T_out = out_len.

    kind: "pt" (packed documents, loss at every position) or "sft" (prompt/answer
      examples, loss and output copies only at answer-predicting positions).
    corpus: entries "embedded" (CPython stdlib + pydoc topics) and/or paths to text
      files, `.jsonl` files (field `text_field`), directories or glob patterns.
    prepared: datasets made by launch/prepare_data.py (their directories or manifest.json
      paths), read lazily instead of `corpus` (PT only; leave `corpus` at its default).
      Several are mixed (grain's weighted mix; realized token shares logged as mix/<name>).
    mixture_weights: one weight > 0 per `prepared` entry (any scale); empty = proportional
      to each dataset's tokens.
    tokenizer: path to a tokenizer.json, or None for UTF-8 bytes (vocab 256); a prepared
      dataset must have been made with the same file.
    seq_len: T, tokens per row. out_len: T_out, output copies per SFT row.
    batch_size: global rows per step; each of `process_count` hosts gets
      batch_size // process_count of them.
    validation_fraction: share of documents (by id hash) held out for evaluation.
    seed: shuffling, bin shuffling and synthetic-task generation; in [0, 2**32).
    shuffle: shuffle training examples (per epoch, by seed).
    sft_task: "docstring" (signature -> first docstring line, from the corpus's .py
      documents), "mqar" or "passkey" (synthetic recall, see recall.py).
    embedded_tests: include the stdlib's test packages in the embedded corpus.
    packing_bins: first-fit packing bins; 0 = per-host batch size.
    recall_*: synthetic task shape (tokens): recall_context = prompt length of a
      generated example (0 = seq_len); recall_pairs / recall_queries = MQAR key-value
      pairs and queries; recall_gap = minimum distance between the last pair and the
      first query (set it > the model's window); recall_filler = "fixed" sentences or
      "pydoc" prose (digits and "=" removed); recall_passkey_digits = digits of the
      passkey (fewer digits: an easier copy, the same retrieval).
    """

    kind: str = "pt"
    corpus: tuple[str, ...] = ("embedded",)
    prepared: tuple[str, ...] = ()
    mixture_weights: tuple[float, ...] = ()
    tokenizer: str | None = None
    seq_len: int = 256
    out_len: int = 64
    batch_size: int = 16
    validation_fraction: float = 0.05
    seed: int = 0
    shuffle: bool = True
    sft_task: str = "docstring"
    embedded_tests: bool = True
    text_field: str = "text"
    packing_bins: int = 0
    recall_context: int = 0
    recall_pairs: int = 8
    recall_queries: int = 4
    recall_gap: int = 128
    recall_filler: str = "fixed"
    recall_passkey_digits: int = 5

    def __post_init__(self) -> None:
        corpus = self.corpus
        if isinstance(corpus, str):
            corpus = tuple(c.strip() for c in corpus.split(",") if c.strip())
        elif isinstance(corpus, (list, tuple)):
            corpus = tuple(corpus)
        else:
            raise ValueError(
                f"DataConfig.corpus must be a string or a sequence of strings, got {corpus!r}"
            )
        if not all(isinstance(c, str) and c for c in corpus) or not (corpus or self.prepared):
            raise ValueError(
                "DataConfig.corpus must name at least one source ('embedded' or paths), "
                f"got {corpus!r}"
            )
        object.__setattr__(self, "corpus", corpus)
        self._check_prepared()
        if self.tokenizer == "":
            object.__setattr__(self, "tokenizer", None)

        if self.kind not in KINDS:
            raise ValueError(
                f"DataConfig.kind={self.kind!r} is unknown; allowed: {', '.join(KINDS)}"
            )
        for name in ("seq_len", "out_len", "batch_size"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("packing_bins", "recall_context", "recall_gap"):
            _check_int(name, getattr(self, name), minimum=0)
        for name in ("recall_pairs", "recall_queries", "recall_passkey_digits"):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int("seed", self.seed, minimum=0)
        if self.seed >= 2**32:
            raise ValueError(
                f"DataConfig.seed must be < 2**32 (grain's shuffle seed), got {self.seed}"
            )
        frac = self.validation_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0.0 <= frac < 1.0:
            raise ValueError(f"DataConfig.validation_fraction must be in [0, 1), got {frac!r}")
        for name in ("shuffle", "embedded_tests"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DataConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.sft_task not in SFT_TASKS:
            raise ValueError(
                f"DataConfig.sft_task={self.sft_task!r} is unknown; allowed: {', '.join(SFT_TASKS)}"
            )
        if self.recall_filler not in FILLERS:
            raise ValueError(
                f"DataConfig.recall_filler={self.recall_filler!r} is unknown; "
                f"allowed: {', '.join(FILLERS)}"
            )
        if self.recall_queries > self.recall_pairs:
            raise ValueError(
                f"DataConfig.recall_queries={self.recall_queries} must be <= "
                f"recall_pairs={self.recall_pairs} (each query asks a distinct key)"
            )
        if self.recall_context > self.seq_len:
            raise ValueError(
                f"DataConfig.recall_context={self.recall_context} "
                f"must be <= seq_len={self.seq_len} "
                "(0 = seq_len)"
            )
        if self.tokenizer is not None and not os.path.isfile(self.tokenizer):
            raise ValueError(
                f"DataConfig.tokenizer={self.tokenizer!r} is not a file; give a tokenizer.json "
                "path or None for bytes"
            )
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError(
                f"DataConfig.text_field must be a non-empty string, got {self.text_field!r}"
            )

    def _check_prepared(self) -> None:
        prepared = _as_tuple("prepared", self.prepared)
        weights = _as_tuple("mixture_weights", self.mixture_weights)
        if not all(isinstance(p, str) and p for p in prepared):
            raise ValueError(f"DataConfig.prepared must be paths, got {self.prepared!r}")
        try:
            weights = tuple(float(w) for w in weights)
        except (TypeError, ValueError):
            raise ValueError(
                f"DataConfig.mixture_weights must be numbers, got {self.mixture_weights!r}"
            ) from None
        object.__setattr__(self, "prepared", prepared)
        object.__setattr__(self, "mixture_weights", weights)
        for i, w in enumerate(weights):
            if not w > 0 or w == float("inf"):
                raise ValueError(f"DataConfig.mixture_weights[{i}]={w} must be a finite number > 0")
        if weights and len(weights) != len(prepared):
            raise ValueError(
                f"DataConfig.mixture_weights has {len(weights)} entries for {len(prepared)} "
                "prepared datasets; give one per dataset, or none (proportional to tokens)"
            )
        if prepared and self.kind != "pt":
            raise ValueError(f"DataConfig.prepared is for kind='pt', got kind={self.kind!r}")
        if prepared and self.corpus not in ((), ("embedded",)):
            raise ValueError(
                f"DataConfig.prepared={prepared!r} replaces corpus={self.corpus!r}; set one of "
                "them (corpus=() or its default with prepared)"
            )

    @property
    def is_synthetic(self) -> bool:
        """True when SFT examples are generated (no corpus is read)."""
        return self.kind == "sft" and self.sft_task in ("mqar", "passkey")

    @property
    def context_len(self) -> int:
        """Prompt length of generated recall examples (tokens)."""
        return self.recall_context or self.seq_len

    def per_host_batch(self, process_count: int) -> int:
        """Rows per host; raises unless batch_size splits evenly over the hosts."""
        if process_count < 1 or self.batch_size % process_count:
            raise ValueError(
                f"DataConfig.batch_size={self.batch_size} must be divisible by the process "
                f"count {process_count} (each host loads batch_size // process_count rows)"
            )
        return self.batch_size // process_count

    def replace(self, **changes: Any) -> DataConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DataConfig:
        """Builds a config from a mapping (e.g. an ml_collections ConfigDict), naming unknown
        keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = dict(values)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown DataConfig field(s) {unknown}; valid fields: {', '.join(sorted(known))}"
            )
        return cls(**values)


def _as_tuple(name: str, value: Any) -> tuple:
    """A comma-separated string (command lines) or a sequence, as a tuple."""
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise ValueError(
        f"DataConfig.{name} must be a sequence or a comma-separated string, got {value!r}"
    )


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"DataConfig.{name} must be {kind}, got {value!r}")
