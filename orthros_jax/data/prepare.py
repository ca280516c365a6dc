"""Tokenising a corpus once into sharded token files (the library half of launch/prepare_data.py).

A prepared dataset is a directory:

    plan.json              the inputs, tokenizer and options, and each shard's pieces of input
    shard_00000.bin        the shard's token ids, documents concatenated (each followed by the
                           tokenizer's EOS when it has one), in `dtype` (uint8/16/32: the
                           smallest that holds the vocab), raw little-endian: np.memmap-able
    shard_00000.docs.npy   one row per document: `end` (int64, exclusive token offset into
                           .bin) and `score` (uint64: the first 8 bytes of SHA-256 of the
                           document's id, which fixes its train/validation split exactly as
                           corpus.validation_score does for raw corpora)
    shard_00000.json       the shard's counts and SHA-256; written last, so it means "done"
    manifest.json          everything training checks (tokenizer hash, vocab, dtype, counts per
                           shard, sources); written once every shard is done

Every file is written to a temporary name and renamed into place, so a killed run leaves
no half-written shard under a final name, and a rerun redoes only the shards without a
record. `prepare_shard` is a pure function of its plan entry (same inputs -> same bytes),
so shards can be mapped over machines by any engine (launch/prepare_data.py --task/--tasks).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from orthros_jax.data.corpus import document_hash, iter_file
from orthros_jax.data.tokenizers import ByteTokenizer, Tokenizer, load_tokenizer

FORMAT = "orthros-tokens-v1"
MANIFEST, PLAN = "manifest.json", "plan.json"
DOCS_DTYPE = np.dtype([("end", "<i8"), ("score", "<u8")])
ENCODE_CHARS = 1 << 20  # documents are tokenised in batches of about this much text
Progress = Callable[[int, int, int], None]  # (documents, tokens, input bytes) since last call


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds ids 0..vocab_size-1."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"vocab_size={vocab_size} does not fit in uint32")


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenizer_record(path: str | None) -> dict[str, Any]:
    """What identifies a tokenizer: its file's SHA-256 ("bytes" for UTF-8 bytes), vocab, EOS."""
    tok = load_tokenizer(path)
    return {
        "path": path,
        "sha256": file_sha256(path) if path else "bytes",
        "vocab_size": int(tok.vocab_size),
        "eos_id": tok.eos_id,
    }


def _split_jsonl(path: str, size: int, shard_bytes: int) -> list[dict[str, Any]]:
    """Pieces of about shard_bytes, each starting at a line start, with their first line number."""
    pieces, start, line = [], 0, 1
    with open(path, "rb") as f:
        while start < size:
            f.seek(min(start + shard_bytes, size))
            f.readline()  # on to the next line start
            end = min(f.tell(), size)
            pieces.append({"path": path, "start": start, "end": end, "line": line})
            f.seek(start)
            line += f.read(end - start).count(b"\n")
            start = end
    return pieces


def plan_shards(files: Sequence[str], shard_bytes: int) -> list[list[dict[str, Any]]]:
    """Shards as lists of pieces {path, start, end, line}: a `.jsonl` over shard_bytes is cut at
    line starts into its own shards; smaller files are grouped in order up to shard_bytes."""
    if shard_bytes < 1:
        raise ValueError(f"shard_bytes must be >= 1, got {shard_bytes}")
    shards: list[list[dict[str, Any]]] = []
    group: list[dict[str, Any]] = []
    grouped = 0
    for path in files:
        size = os.path.getsize(path)
        if path.endswith(".jsonl") and size > shard_bytes:
            shards.extend([p] for p in _split_jsonl(path, size, shard_bytes))
            continue
        group.append({"path": path, "start": 0, "end": size, "line": 1})
        grouped += size
        if grouped >= shard_bytes:
            shards.append(group)
            group, grouped = [], 0
    if group:
        shards.append(group)
    return shards


def make_plan(
    files: Sequence[str],
    tokenizer: str | None,
    *,
    text_field: str,
    skip_bad: bool,
    shard_bytes: int,
) -> dict[str, Any]:
    """The full description of a preparation (deterministic: no times, no absolute paths added)."""
    if not files:
        raise ValueError("the corpus has no input files")
    return {
        "format": FORMAT,
        "tokenizer": tokenizer_record(tokenizer),
        "text_field": text_field,
        "skip_bad": skip_bad,
        "shard_bytes": shard_bytes,
        "sources": [{"path": f, "bytes": os.path.getsize(f)} for f in files],
        "shards": plan_shards(files, shard_bytes),
    }


def shard_name(index: int) -> str:
    return f"shard_{index:05d}"


def _write_json(path: str, value: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def encode_documents(tok: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Each text's ids (+ EOS when the tokenizer has one), in token_dtype(vocab)."""
    dtype = token_dtype(tok.vocab_size)
    if isinstance(tok, ByteTokenizer):
        return [np.frombuffer(t.encode("utf-8"), np.uint8) for t in texts]
    batch_encode = getattr(tok, "encode_batch", None)
    lists = batch_encode(texts) if batch_encode else [tok.encode(t) for t in texts]
    eos = [] if tok.eos_id is None else [tok.eos_id]
    return [np.asarray(ids + eos, dtype) for ids in lists]


def shard_done(out_dir: str, index: int) -> dict[str, Any] | None:
    """The shard's record when it is complete on disk (record present, file sizes right)."""
    name = os.path.join(out_dir, shard_name(index))
    try:
        with open(name + ".json") as f:
            record = json.load(f)
        itemsize = np.dtype(record["dtype"]).itemsize
        ok = os.path.getsize(name + ".bin") == record["tokens"] * itemsize
        docs = np.load(name + ".docs.npy", mmap_mode="r")
        ok = ok and docs.shape == (record["documents"],)
    except (OSError, ValueError, KeyError):
        return None
    return record if ok else None


def prepare_shard(
    out_dir: str, index: int, plan: dict[str, Any], progress: Progress | None = None
) -> dict[str, Any]:
    """Tokenises shard `index` of the plan into out_dir (temp files renamed into place) and
    returns its record; a shard already done is returned as is."""
    done = shard_done(out_dir, index)
    if done is not None:
        return done
    tok = load_tokenizer(plan["tokenizer"]["path"])
    dtype = token_dtype(tok.vocab_size)
    name = os.path.join(out_dir, shard_name(index))
    pieces = plan["shards"][index]
    tmp = f".tmp{os.getpid()}"
    sha = hashlib.sha256()
    ends: list[int] = []
    scores: list[int] = []
    counts = {"documents": 0, "tokens": 0, "text_bytes": 0}
    texts: list[str] = []

    def flush(f) -> None:
        arrays = encode_documents(tok, texts)
        data = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)
        f.write(data.tobytes())
        sha.update(data.tobytes())
        total = counts["tokens"]
        for a in arrays:
            total += len(a)
            ends.append(total)
        text_bytes = sum(len(t.encode("utf-8")) for t in texts)
        counts["tokens"], counts["documents"] = total, counts["documents"] + len(texts)
        counts["text_bytes"] += text_bytes
        if progress is not None:
            progress(len(texts), int(data.size), text_bytes)
        texts.clear()

    skipped = []
    on_bad = skipped.append if plan["skip_bad"] else None
    with open(name + ".bin" + tmp, "wb") as f:
        chars = 0
        for piece in pieces:
            byte_range = (piece["start"], piece["end"], piece["line"])
            for doc in iter_file(piece["path"], plan["text_field"], on_bad, byte_range):
                texts.append(doc.text)
                scores.append(document_hash(doc.id))
                chars += len(doc.text)
                if chars >= ENCODE_CHARS:
                    flush(f)
                    chars = 0
        flush(f)
        f.flush()
        os.fsync(f.fileno())
    docs_array = np.zeros(len(ends), DOCS_DTYPE)
    docs_array["end"], docs_array["score"] = ends, np.array(scores, np.uint64)
    with open(name + ".docs.npy" + tmp, "wb") as f:
        np.save(f, docs_array)
        f.flush()
        os.fsync(f.fileno())
    if progress is not None:  # the rest of the input bytes (markup, skipped lines): bar at 100%
        progress(0, 0, max(0, sum(p["end"] - p["start"] for p in pieces) - counts["text_bytes"]))
    os.replace(name + ".bin" + tmp, name + ".bin")
    os.replace(name + ".docs.npy" + tmp, name + ".docs.npy")
    record = {
        "name": shard_name(index),
        "dtype": dtype.name,
        "sha256": sha.hexdigest(),
        "skipped": len(skipped),
        "skipped_lines": skipped[:20],
        **counts,
    }
    _write_json(name + ".json", record)
    return record


def check_plan(out_dir: str, plan: dict[str, Any]) -> None:
    """Writes plan.json into a new out_dir, or checks that an earlier run's plan is this one."""
    path = os.path.join(out_dir, PLAN)
    if os.path.isfile(path):
        with open(path) as f:
            old = json.load(f)
        if old != json.loads(json.dumps(plan)):
            diff = sorted(k for k in plan if old.get(k) != json.loads(json.dumps(plan[k])))
            raise ValueError(
                f"{out_dir} holds a preparation with other {', '.join(diff)}; resume with the "
                "same inputs and options, or choose a new output directory"
            )
        return
    os.makedirs(out_dir, exist_ok=True)
    _write_json(path, plan)


def remove_temporaries(out_dir: str) -> None:
    """Deletes what a killed run left under temporary names (never a finished file)."""
    for name in os.listdir(out_dir):
        if ".tmp" in name:
            os.remove(os.path.join(out_dir, name))


def write_manifest(out_dir: str, plan: dict[str, Any], records: Sequence[dict[str, Any]]) -> dict:
    """manifest.json from the plan and every shard's record (in shard order)."""
    if len(records) != len(plan["shards"]):
        raise ValueError(f"{len(records)} shard records for {len(plan['shards'])} shards")
    dtype = token_dtype(plan["tokenizer"]["vocab_size"]).name
    shards = [r | {"pieces": p} for r, p in zip(records, plan["shards"], strict=True)]
    manifest = {
        "format": FORMAT,
        "tokenizer": plan["tokenizer"],
        "dtype": dtype,
        "text_field": plan["text_field"],
        "sources": plan["sources"],
        "shards": shards,
        **{k: sum(r[k] for r in records) for k in ("documents", "tokens", "text_bytes", "skipped")},
    }
    _write_json(os.path.join(out_dir, MANIFEST), manifest)
    return manifest
