"""Corpus sources: the embedded corpus (CPython's stdlib + pydoc topics) and text/jsonl/parquet
files.

A corpus is a sorted, deterministic list of `Document(id, text)`. The train/validation
split is a pure function of each document's id (a SHA-256 hash against the validation
fraction), so it never depends on the seed, the order of the corpus or the host, and the
held-out split can never overlap training.

The embedded corpus is the running interpreter's standard library source
(`sysconfig.get_paths()["stdlib"]`, every `*.py` file, test packages included — they
are real Python and roughly double the text) minus `site-packages` and the
machine-specific build files (`_sysconfigdata_*`, `config-*`), plus every topic of
`pydoc_data.topics.topics` as one English document each. With Python 3.11 that is
~1,790 files (~31 MB) and 79 topics.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import pathlib
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Sequence

EMBEDDED = "embedded"
# Suffixes read when a corpus entry is a directory (walked recursively, sorted).
TEXT_SUFFIXES: tuple[str, ...] = (".txt", ".md", ".rst", ".py", ".jsonl", ".parquet")
_TEST_DIRS = frozenset({"test", "tests", "idle_test"})


@dataclasses.dataclass(frozen=True)
class Document:
    """One document: a stable id (used for the split) and its text."""

    id: str
    text: str


def _stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def _is_machine_specific(rel: pathlib.PurePath) -> bool:
    # These differ between builds of the same Python version; leaving them out keeps
    # the corpus (and hence a run) identical across machines with the same version.
    return rel.name.startswith("_sysconfigdata_") or rel.parts[0].startswith("config-")


@functools.lru_cache(maxsize=4)
def embedded_documents(include_tests: bool = True) -> tuple[Document, ...]:
    """The stdlib's `*.py` files (ids `stdlib/<relative path>`) then `pydoc/<topic>`."""
    root = _stdlib_root()
    docs: list[Document] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "site-packages" in rel.parts or "dist-packages" in rel.parts:
            continue
        if _is_machine_specific(rel):
            continue
        if not include_tests and _TEST_DIRS.intersection(rel.parts[:-1]):
            continue
        # A few test files are deliberately not UTF-8; replacement keeps them as text.
        text = path.read_bytes().decode("utf-8", errors="replace")
        docs.append(Document(f"stdlib/{rel.as_posix()}", text))
    from pydoc_data.topics import topics

    docs.extend(Document(f"pydoc/{name}", topics[name]) for name in sorted(topics))
    return tuple(docs)


def pydoc_text() -> str:
    """All pydoc topics joined in sorted order: English prose used as NIAH filler."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def _expand(entry: str) -> list[str]:
    """A file, a directory (recursive, TEXT_SUFFIXES) or a glob, as sorted file paths."""
    if os.path.isdir(entry):
        files = [
            str(p)
            for p in pathlib.Path(entry).rglob("*")
            if p.is_file() and p.suffix in TEXT_SUFFIXES
        ]
    elif os.path.isfile(entry):
        files = [entry]
    else:
        files = [f for f in glob.glob(entry, recursive=True) if os.path.isfile(f)]
    if not files:
        raise ValueError(
            f"DataConfig.corpus entry {entry!r} matches no file; give {EMBEDDED!r}, a file, "
            "a directory or a glob pattern"
        )
    return sorted(files)


OnBad = Callable[[str], None]


def _bad(path: str, where: str, why: str, on_bad: OnBad | None) -> None:
    """A ValueError naming file and line/row, or on_bad(message) when given (the line is
    skipped)."""
    message = f"{path}:{where} {why}"
    if on_bad is None:
        raise ValueError(message)
    on_bad(message)


def iter_file(
    path: str,
    text_field: str = "text",
    on_bad: OnBad | None = None,
    byte_range: tuple[int, int, int] | None = None,
) -> Iterator[Document]:
    """Documents of one file, streamed: one per line of a `.jsonl` (its `text_field`), one per
    row of a `.parquet` (column `text_field`), else the whole file as one document.

    Ids are `<path>:<line>` (jsonl), `<path>:<row>` (parquet, 1-based) or `<path>`; empty
    texts are skipped. A line that is not JSON / not UTF-8 / lacks the field, or a null or
    non-string cell, raises a ValueError naming the file and line, or is skipped after
    on_bad(that message) when on_bad is given. byte_range = (start, end, line of start) reads only
    the `.jsonl` lines that start in [start, end) (start at a line start).
    """
    if path.endswith(".jsonl"):
        start, end, first = byte_range or (0, None, 1)
        with open(path, "rb") as f:
            f.seek(start)
            pos = start
            for lineno, raw in enumerate(f, start=first):
                if end is not None and pos >= end:
                    break
                pos += len(raw)
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    _bad(path, str(lineno), f"is not valid UTF-8 JSON: {e}", on_bad)
                    continue
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                    why = f"has no string {text_field!r} field (text_field); keys: {keys}"
                    _bad(path, str(lineno), why, on_bad)
                    continue
                if record[text_field]:
                    yield Document(f"{path}:{lineno}", record[text_field])
    elif path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        if text_field not in table.schema_arrow.names:
            raise ValueError(
                f"{path} has no column {text_field!r} (text_field); columns: "
                f"{table.schema_arrow.names}"
            )
        row = 0
        for batch in table.iter_batches(columns=[text_field], batch_size=1024):
            for text in batch.column(0).to_pylist():
                row += 1
                if not isinstance(text, str):
                    _bad(path, str(row), f"column {text_field!r} is {text!r}, not text", on_bad)
                elif text:
                    yield Document(f"{path}:{row}", text)
    elif byte_range is not None and byte_range[:2] != (0, os.path.getsize(path)):
        raise ValueError(f"{path}: only .jsonl files are read in byte ranges, got {byte_range}")
    else:
        text = pathlib.Path(path).read_bytes().decode("utf-8", errors="replace")
        if text:
            yield Document(path, text)


def file_documents(path: str, text_field: str = "text") -> list[Document]:
    """All documents of one file (iter_file), stopping at the first bad line."""
    return list(iter_file(path, text_field))


def expand_corpus(corpus: Sequence[str]) -> list[str]:
    """The files of a corpus spec without "embedded": entries in order, each one's files sorted."""
    return [path for entry in corpus if entry != EMBEDDED for path in _expand(entry)]


def load_documents(
    corpus: Sequence[str], *, include_tests: bool = True, text_field: str = "text"
) -> list[Document]:
    """All documents of a corpus spec, in a deterministic order (entries in order, files sorted)."""
    docs: list[Document] = []
    for entry in corpus:
        if entry == EMBEDDED:
            docs.extend(embedded_documents(include_tests))
            continue
        for path in _expand(entry):
            docs.extend(file_documents(path, text_field))
    return docs


def document_hash(doc_id: str) -> int:
    """The first 8 bytes of the id's SHA-256 (not Python's salted hash), as an int < 2**64."""
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big")


def validation_score(doc_id: str) -> float:
    """A uniform number in [0, 1) fixed by the document id: document_hash / 2**64."""
    return document_hash(doc_id) / 2**64


def is_validation(doc_id: str, validation_fraction: float) -> bool:
    """True when the document belongs to the held-out split."""
    return validation_score(doc_id) < validation_fraction


def split_documents(
    docs: Iterable[Document], validation_fraction: float
) -> tuple[list[Document], list[Document]]:
    """(train, validation), each in corpus order. Disjoint by construction."""
    train, val = [], []
    for doc in docs:
        (val if is_validation(doc.id, validation_fraction) else train).append(doc)
    return train, val
