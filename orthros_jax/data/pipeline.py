"""Entry points: training iterators and evaluation batches for PT and SFT (grain).

    it = make_train_iterator(cfg, process_index=i, process_count=n)  # infinite, checkpointable
    batch = next(it)                                                 # dict of numpy arrays
    evals = make_eval_batches(cfg, max_batches=8)                     # list, same on every run

PT documents -> (input, target) pairs: a document's ids d (+ EOS when the tokenizer has
one) give pairs (d[i], d[i+1]); they are cut into chunks of at most T pairs, one chunk
per packed segment, so a loss term never predicts across a document boundary and the
last position of a segment still has a real target (the next token of its document).
A document longer than T+1 tokens becomes several segments (positions restart in each).

Prepared datasets (DataConfig.prepared, made by launch/prepare_data.py) give the same
elements from memory-mapped shards (prepared.py): nothing is tokenised or held in memory,
and a host reads only its own elements; several are mixed (mixture.py).

Training: elements are shuffled per epoch by seed (grain index shuffle, reseeded every
epoch), repeated forever, then every host takes every process_count-th element of that
global stream (disjoint within each epoch), packs first-fit and batches its
batch_size // process_count rows. The iterator's get_state/set_state (JSON-serialisable)
resume it exactly; it also works with grain.checkpoint.CheckpointSave/CheckpointRestore.

Evaluation: the held-out elements in corpus order are packed into global batches of
batch_size rows (the last one padded with empty rows, loss_mask 0); host i gets rows
[i*b, (i+1)*b) of each, so every host gets the same number of batches.
"""

from __future__ import annotations

import functools
import sys

import grain
import numpy as np

from orthros_jax.data import mixture, packing, sft
from orthros_jax.data.config import DataConfig
from orthros_jax.data.corpus import load_documents, split_documents
from orthros_jax.data.prepare import encode_documents
from orthros_jax.data.recall import EVAL_STREAM, TRAIN_STREAM
from orthros_jax.data.tokenizers import Tokenizer, load_tokenizer

# Element work is numpy slicing: a few threads and a modest buffer are plenty and keep the
# iterator cheap on small CPU hosts.
READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=64)
DEFAULT_SYNTHETIC_EVAL_BATCHES = 4


class TokenChunks:
    """PT elements of one split: a flat token array and (start, pairs) per chunk."""

    def __init__(self, ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.ids, self.starts, self.lengths = ids, starts, lengths

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        s, n = int(self.starts[i]), int(self.lengths[i])
        return {
            "tokens": self.ids[s : s + n].astype(np.int32),
            "targets": self.ids[s + 1 : s + n + 1].astype(np.int32),
        }


def chunk_documents(token_docs: list[np.ndarray], seq_len: int) -> TokenChunks:
    """Concatenates documents and cuts each one's n-1 pairs into chunks of <= seq_len pairs."""
    sizes = np.array([len(d) for d in token_docs], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
    starts, lengths = [], []
    for off, n in zip(offsets, sizes, strict=True):
        pairs = n - 1
        if pairs < 1:
            continue  # a 1-token document predicts nothing
        k = np.arange(0, pairs, seq_len)
        starts.append(off + k)
        lengths.append(np.minimum(seq_len, pairs - k))
    ids = np.concatenate(token_docs) if token_docs else np.zeros(0, np.uint8)
    if not starts:
        return TokenChunks(ids, np.zeros(0, np.int64), np.zeros(0, np.int64))
    return TokenChunks(ids, np.concatenate(starts), np.concatenate(lengths))


@functools.lru_cache(maxsize=4)
def pt_chunks(
    corpus: tuple[str, ...],
    include_tests: bool,
    text_field: str,
    tokenizer_path: str | None,
    validation_fraction: float,
    seq_len: int,
) -> tuple[TokenChunks, TokenChunks]:
    """(train, validation) PT chunks; cached because tokenising the corpus is the slow part."""
    tok = load_tokenizer(tokenizer_path)
    docs = load_documents(corpus, include_tests=include_tests, text_field=text_field)
    train, val = split_documents(docs, validation_fraction)
    return tuple(
        chunk_documents(encode_documents(tok, [d.text for d in part]), seq_len)
        for part in (train, val)
    )


def _process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax  # only when the caller did not say; keeps the data package jax-free otherwise

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} must be in [0, process_count={process_count})"
        )
    return process_index, process_count


def _split_elements(cfg: DataConfig, split: str) -> grain.MapDataset | None:
    """A finite MapDataset of the split's elements, or None for generated tasks."""
    if cfg.is_synthetic:
        return None
    if len(cfg.prepared) == 1:
        return mixture.single(cfg, split)  # memory-mapped shards (prepared.py)
    if cfg.prepared:
        return mixture.eval_mixture(cfg)
    idx = 0 if split == "train" else 1
    if cfg.kind == "pt":
        source = pt_chunks(
            cfg.corpus,
            cfg.embedded_tests,
            cfg.text_field,
            cfg.tokenizer,
            cfg.validation_fraction,
            cfg.seq_len,
        )[idx]
    else:
        source = sft.docstring_elements(
            cfg.corpus,
            cfg.embedded_tests,
            cfg.text_field,
            cfg.tokenizer,
            cfg.validation_fraction,
            cfg.seq_len,
            cfg.out_len,
        )[idx]
    if len(source) == 0:
        raise ValueError(
            f"the {split} split of DataConfig.corpus={cfg.corpus!r} has no "
            f"{'documents' if cfg.kind == 'pt' else 'docstring examples'} (validation_fraction="
            f"{cfg.validation_fraction}); use a larger corpus or another validation_fraction"
        )
    return grain.MapDataset.source(source)


def _generated(cfg: DataConfig, stream: int, count: int = sys.maxsize) -> grain.MapDataset:
    task = sft.recall_task(cfg)
    seed = cfg.seed

    def make(i: int) -> dict[str, np.ndarray]:
        return sft.recall_element(task, seed, i, stream)

    return grain.MapDataset.range(count).map(make)


def _packed(
    cfg: DataConfig, ds: grain.IterDataset, bins: int, shuffle_bins: bool, features=()
) -> grain.IterDataset:
    return packing.pack(
        ds,
        cfg.kind,
        seq_len=cfg.seq_len,
        out_len=cfg.out_len,
        num_bins=bins,
        seed=cfg.seed,
        shuffle_bins=shuffle_bins,
        token_features=features,
    )


def train_elements(cfg: DataConfig, process_index: int, process_count: int) -> grain.MapDataset:
    """Host process_index's infinite share of the training elements, in order (before packing):
    every process_count-th element of the shuffled, repeated (or mixed) global stream."""
    mixed = len(cfg.prepared) > 1
    ds = _split_elements(cfg, "train") if not mixed else None
    if mixed:
        ds = mixture.train_mixture(cfg)  # each component shuffled and repeated
    elif ds is None:
        ds = _generated(cfg, TRAIN_STREAM)  # fresh examples forever: already in random order
    else:
        if cfg.shuffle:
            ds = ds.shuffle(cfg.seed)  # reseeded per epoch by repeat()
        ds = ds.repeat()
    return ds[process_index::process_count]


def make_train_dataset(
    cfg: DataConfig, *, process_index: int | None = None, process_count: int | None = None
) -> grain.IterDataset:
    """The infinite per-host training IterDataset (batches of batch_size // process_count rows)."""
    pi, pc = _process(process_index, process_count)
    rows = cfg.per_host_batch(pc)
    mixed = len(cfg.prepared) > 1
    it = train_elements(cfg, pi, pc).to_iter_dataset(READ_OPTIONS)
    features = (mixture.SOURCE,) if mixed else ()
    it = _packed(cfg, it, cfg.packing_bins or rows, shuffle_bins=cfg.shuffle, features=features)
    kind = cfg.kind
    it = it.batch(rows, drop_remainder=True).map(functools.partial(packing.finalize, kind))
    return mixture.SourceShares(it, mixture.names(cfg)) if mixed else it


def make_train_iterator(
    cfg: DataConfig, *, process_index: int | None = None, process_count: int | None = None
) -> grain.DatasetIterator:
    """An infinite, checkpointable iterator of training batches (see module docstring).

    process_index/process_count default to jax.process_index()/jax.process_count().
    """
    return iter(make_train_dataset(cfg, process_index=process_index, process_count=process_count))


def make_eval_batches(
    cfg: DataConfig,
    max_batches: int | None = None,
    *,
    process_index: int | None = None,
    process_count: int | None = None,
) -> list[dict[str, np.ndarray]]:
    """Held-out batches, identical on every call, seed-independent for corpus data.

    All of the split (or max_batches global batches of it) in corpus order; generated
    tasks use a stream disjoint from training's, max_batches (default 4) batches of it.
    """
    pi, pc = _process(process_index, process_count)
    rows = cfg.per_host_batch(pc)
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be >= 1 or None, got {max_batches}")
    ds = _split_elements(cfg, "validation")
    if ds is None:
        n = (max_batches or DEFAULT_SYNTHETIC_EVAL_BATCHES) * cfg.batch_size
        ds = _generated(cfg, EVAL_STREAM, n)
    it = _packed(cfg, ds.to_iter_dataset(READ_OPTIONS), cfg.batch_size, shuffle_bins=False)
    it = it.batch(cfg.batch_size, drop_remainder=False)
    out = []
    for batch in it:
        full = packing.pad_rows(packing.finalize(cfg.kind, batch), cfg.batch_size)
        out.append({k: v[pi * rows : (pi + 1) * rows] for k, v in full.items()})
        if max_batches is not None and len(out) >= max_batches:
            break
    return out


def tokenizer_for(cfg: DataConfig) -> Tokenizer:
    """The tokenizer the pipeline uses (its vocab_size must be <= the model's)."""
    return load_tokenizer(cfg.tokenizer)
