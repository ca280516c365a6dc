"""Corpus sources: the embedded corpus (CPython's stdlib + pydoc topics) and text/jsonl files.

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
from collections.abc import Iterable, Sequence

EMBEDDED = "embedded"
# Suffixes read when a corpus entry is a directory (walked recursively, sorted).
TEXT_SUFFIXES: tuple[str, ...] = (".txt", ".md", ".rst", ".py", ".jsonl")
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


def file_documents(path: str, text_field: str = "text") -> list[Document]:
    """Documents of one file: one per line of a `.jsonl` (its `text_field`), else the whole file.

    Ids are `<path>` or `<path>:<line number>`; empty texts are skipped.
    """
    if path.endswith(".jsonl"):
        docs = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno} is not valid JSON: {e}") from None
                if not isinstance(record, dict) or text_field not in record:
                    raise ValueError(
                        f"{path}:{lineno} has no {text_field!r} field (DataConfig.text_field); "
                        f"keys: {sorted(record) if isinstance(record, dict) else type(record).__name__}"
                    )
                text = str(record[text_field])
                if text:
                    docs.append(Document(f"{path}:{lineno}", text))
        return docs
    text = pathlib.Path(path).read_bytes().decode("utf-8", errors="replace")
    return [Document(path, text)] if text else []


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


def validation_score(doc_id: str) -> float:
    """A uniform number in [0, 1) fixed by the document id (SHA-256, not Python's salted hash)."""
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


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
