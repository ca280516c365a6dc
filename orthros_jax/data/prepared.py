"""Prepared datasets (launch/prepare_data.py, layout in data/prepare.py) read lazily by chunk.

    source = open_split(directory, tokenizer, seq_len, validation_fraction, "train")
    len(source); source[i] -> {"tokens": [n] int32, "targets": [n] int32}   (n <= seq_len)

The elements are exactly those of pipeline.chunk_documents on the same documents: each
document's n-1 (token, next token) pairs cut into chunks of <= seq_len pairs, documents of
the split in corpus order; the split is by document (the hash prepare stored per document,
the same as corpus.is_validation). Tokens stay in the shard files; an element reads only its
own bytes (os.pread: nothing is mapped into the process, so its memory does not grow with
the corpus or with what was read; the OS page cache keeps hot data). The chunk table
([n_chunks, 2] int64: global token start, pairs) is built once per (split, seq_len,
validation_fraction), vectorised per shard, and streamed to an .npy beside the shards (index/,
atomic rename; in memory when the directory is read-only), then read row by row: start-up and memory
do not grow with the corpus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

import numpy as np

from orthros_jax.data.prepare import DOCS_DTYPE, FORMAT, MANIFEST, file_sha256, token_dtype

INDEX_DIR = "index"


def manifest_file(entry: str) -> str:
    """The manifest.json of a DataConfig.prepared entry (the directory or the file itself)."""
    path = os.path.join(entry, MANIFEST) if os.path.isdir(entry) else entry
    if not os.path.isfile(path):
        raise ValueError(
            f"DataConfig.prepared entry {entry!r} has no {MANIFEST}; make it with "
            "launch/prepare_data.py (an interrupted preparation writes it only when complete)"
        )
    return path


def tokenizer_sha256(tokenizer: str | None) -> str:
    return file_sha256(tokenizer) if tokenizer else "bytes"


def load_manifest(entry: str, tokenizer: str | None) -> tuple[str, dict[str, Any]]:
    """(directory, manifest) after checking the tokenizer and every shard's files.

    ValueError (one line, before anything compiles) for another tokenizer than
    DataConfig.tokenizer, or a shard file that is missing or not of the recorded size."""
    path = manifest_file(entry)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        manifest = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); prepare the dataset again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} manifest (launch/prepare_data.py makes one)")
    manifest["fingerprint"] = hashlib.sha256(raw).hexdigest()[:16]
    made_with, want = manifest["tokenizer"], tokenizer_sha256(tokenizer)
    if made_with["sha256"] != want:
        raise ValueError(
            f"{path} was tokenized with {made_with['path'] or 'bytes'} (sha256 "
            f"{made_with['sha256'][:12]}) but DataConfig.tokenizer={tokenizer!r} (sha256 "
            f"{want[:12]}); set DataConfig.tokenizer to the dataset's or prepare it again"
        )
    directory = os.path.dirname(os.path.abspath(path))
    itemsize = np.dtype(manifest["dtype"]).itemsize
    if token_dtype(made_with["vocab_size"]) != np.dtype(manifest["dtype"]):
        raise ValueError(f"{path}: dtype {manifest['dtype']} does not match its vocab")
    for shard in manifest["shards"]:
        base = os.path.join(directory, shard["name"])
        for suffix in (".bin", ".docs.npy"):
            if not os.path.isfile(base + suffix):
                raise ValueError(
                    f"{base}{suffix} (listed in {path}) is missing; rerun launch/prepare_data.py "
                    "with the same --output to redo it"
                )
        size, want_size = os.path.getsize(base + ".bin"), shard["tokens"] * itemsize
        if size != want_size:
            raise ValueError(
                f"{base}.bin has {size} bytes but {path} records {want_size} "
                f"({shard['tokens']} tokens); the shard is truncated or stale, prepare it again"
            )
        try:
            docs = np.load(base + ".docs.npy", mmap_mode="r")
        except (OSError, ValueError) as e:
            raise ValueError(
                f"{base}.docs.npy is unreadable or truncated ({e}); prepare it again"
            ) from None
        if docs.dtype != DOCS_DTYPE or docs.shape != (shard["documents"],):
            raise ValueError(
                f"{base}.docs.npy holds {docs.shape} {docs.dtype} but {path} records "
                f"{shard['documents']} documents; the shard is truncated or stale, prepare it again"
            )
    return directory, manifest


def _documents(
    docs: np.ndarray, seq_len: int, validation_fraction: float, validation: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, pairs, chunk count) of each document of the split in one shard."""
    ends = docs["end"].astype(np.int64)
    starts = np.concatenate([np.zeros(1, np.int64), ends[:-1]])
    pairs = ends - starts - 1
    held_out = docs["score"].astype(np.float64) / 2**64 < validation_fraction
    keep = (held_out == validation) & (pairs >= 1)  # a 1-token document predicts nothing
    return starts[keep], pairs[keep], (pairs[keep] + seq_len - 1) // seq_len


def shard_chunks(
    docs: np.ndarray, seq_len: int, validation_fraction: float, validation: bool
) -> np.ndarray:
    """[k, 2] int64 (start in the shard, pairs) of the split's chunks of one shard, in order."""
    starts, pairs, counts = _documents(docs, seq_len, validation_fraction, validation)
    doc = np.repeat(np.arange(len(starts)), counts)
    j = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    offset = j * seq_len
    return np.stack([starts[doc] + offset, np.minimum(seq_len, pairs[doc] - offset)], axis=1)


def _build_index(
    directory: str, manifest: dict, key: tuple, path: str | None
) -> np.ndarray | ChunkTable:
    """The chunk table over all shards (global token starts). With a path it is streamed to
    that .npy shard by shard (memory: one shard's table) and returned as a ChunkTable."""
    seq_len, fraction, validation = key
    shard_offsets = np.cumsum([0] + [s["tokens"] for s in manifest["shards"]])

    def docs(shard: dict) -> np.ndarray:
        return np.load(os.path.join(directory, shard["name"] + ".docs.npy"), mmap_mode="r")

    def parts():
        for shard, offset in zip(manifest["shards"], shard_offsets, strict=False):
            chunks = shard_chunks(docs(shard), seq_len, fraction, validation)
            chunks[:, 0] += offset
            yield chunks

    if path is None:
        return np.concatenate([np.zeros((0, 2), np.int64), *parts()])
    total = sum(int(_documents(docs(s), *key)[2].sum()) for s in manifest["shards"])
    if total == 0:
        return np.zeros((0, 2), np.int64)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        header = {"descr": "<i8", "fortran_order": False, "shape": (total, 2)}
        np.lib.format.write_array_header_1_0(f, header)
        for chunks in parts():
            f.write(chunks.astype("<i8").tobytes())
    os.replace(tmp, path)
    return ChunkTable(path=path)


def chunk_index(
    directory: str, manifest: dict, seq_len: int, validation_fraction: float, validation: bool
) -> ChunkTable:
    """The split's chunk table, read from its cached .npy (built on first use)."""
    split = "validation" if validation else "train"
    name = f"{split}_T{seq_len}_v{validation_fraction!r}_{manifest['fingerprint']}.npy"
    path = os.path.join(directory, INDEX_DIR, name)
    if os.path.isfile(path):
        try:
            return ChunkTable(path=path)
        except (OSError, ValueError):
            logging.warning("rebuilding the unreadable chunk index %s", path)
    key = (seq_len, validation_fraction, validation)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        table = _build_index(directory, manifest, key, path)
    except OSError:  # a read-only dataset: the table in memory
        table = _build_index(directory, manifest, key, None)
    return table if isinstance(table, ChunkTable) else ChunkTable(array=table)


class _File:
    """A read-only file read with os.pread (thread-safe, nothing mapped into the process: the
    OS page cache holds what was read, and RSS does not grow with the file). Picklable."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)

    def read(self, offset: int, size: int) -> bytes:
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise ValueError(f"{self.path}: {len(data)} of {size} bytes at {offset} (truncated?)")
        return data

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def __del__(self, _close=os.close) -> None:  # os may be gone at interpreter exit
        fd = getattr(self, "_fd", None)
        if fd is not None:
            _close(fd)


class ChunkTable:
    """A split's chunk table: rows (global token start, pairs) int64, read row by row from its
    .npy file, or held in memory (`array`)."""

    def __init__(self, path: str | None = None, array: np.ndarray | None = None) -> None:
        self.array, self.file = array, None
        if path is not None:
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                if version != (1, 0):
                    raise ValueError(f"{path}: npy format {version}, expected (1, 0)")
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                self.offset = f.tell()
            if dtype != np.dtype("<i8") or fortran or len(shape) != 2 or shape[1] != 2:
                raise ValueError(f"{path} is not an [n, 2] int64 chunk table")
            want = self.offset + shape[0] * 16
            if os.path.getsize(path) != want:
                raise ValueError(f"{path} has {os.path.getsize(path)} bytes, expected {want}")
            self.rows, self.file = shape[0], _File(path)
        elif array is not None:
            self.rows = len(array)
        else:
            raise ValueError("ChunkTable needs a path or an array")

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> tuple[int, int]:
        if self.file is None:
            start, n = self.array[i]
        else:
            start, n = np.frombuffer(self.file.read(self.offset + 16 * i, 16), "<i8")
        return int(start), int(n)

    def to_numpy(self) -> np.ndarray:
        """The whole table (tests and tools; training reads rows)."""
        if self.file is None:
            return np.asarray(self.array)
        return np.load(self.file.path)


class PreparedChunks:
    """A grain random-access source of one split's PT chunks (see module docstring)."""

    def __init__(self, directory: str, manifest: dict, index: ChunkTable) -> None:
        self.dtype = np.dtype(manifest["dtype"])
        self.index = index
        self.offsets = np.cumsum([0] + [s["tokens"] for s in manifest["shards"]])
        self.shards = [
            _File(os.path.join(directory, s["name"] + ".bin")) for s in manifest["shards"]
        ]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        start, n = self.index[i]
        shard = int(np.searchsorted(self.offsets, start, side="right")) - 1
        size = self.dtype.itemsize
        raw = self.shards[shard].read((start - int(self.offsets[shard])) * size, (n + 1) * size)
        ids = np.frombuffer(raw, self.dtype).astype(np.int32)
        return {"tokens": ids[:-1], "targets": ids[1:]}


def open_split(
    entry: str, tokenizer: str | None, seq_len: int, validation_fraction: float, split: str
) -> tuple[PreparedChunks, dict[str, Any]]:
    """(source of the split's chunks, manifest) of one DataConfig.prepared entry."""
    directory, manifest = load_manifest(entry, tokenizer)
    index = chunk_index(directory, manifest, seq_len, validation_fraction, split != "train")
    return PreparedChunks(directory, manifest, index), manifest
