"""Prepared datasets as grain MapDatasets: one dataset, or a weighted mixture of several.

Training mixture: component k's chunks are shuffled with its own seed (derived from
DataConfig.seed and k, reseeded every epoch by repeat()) and repeated forever; grain's
MapDataset.mix interleaves them deterministically in the weights' proportions (of
elements). Each element carries `source` = k + 1 per token through packing; SourceShares
takes it off the batches and counts the loss tokens of each component, so
`metrics()` is the realized token share per dataset since step 0 (its counts are part of
the iterator state, hence checkpointed and resumed). Validation: each component's held-out
chunks in order, mixed with the same weights (finite, seed-independent).
"""

from __future__ import annotations

import os
from typing import Any

import grain
import numpy as np

from orthros_jax.data.config import DataConfig
from orthros_jax.data.prepared import PreparedChunks, open_split

SOURCE = "source"


def _open(cfg: DataConfig, split: str) -> list[tuple[PreparedChunks, dict[str, Any]]]:
    out = []
    for entry in cfg.prepared:
        source, manifest = open_split(
            entry, cfg.tokenizer, cfg.seq_len, cfg.validation_fraction, split
        )
        if len(source) == 0:
            raise ValueError(
                f"the {split} split of DataConfig.prepared entry {entry!r} has no documents "
                f"(validation_fraction={cfg.validation_fraction}); use a larger dataset or "
                "another validation_fraction"
            )
        out.append((source, manifest))
    return out


def names(cfg: DataConfig) -> list[str]:
    """One metric name per prepared dataset: its directory's name (+ #k when repeated)."""
    base = [
        os.path.basename(
            os.path.dirname(os.path.abspath(e)) if e.endswith(".json") else e.rstrip("/")
        )
        for e in cfg.prepared
    ]
    return [b if base.count(b) == 1 else f"{b}#{k}" for k, b in enumerate(base)]


def _weights(cfg: DataConfig, manifests: list[dict[str, Any]]) -> list[float]:
    return list(cfg.mixture_weights) or [float(m["tokens"]) for m in manifests]


def component_seed(seed: int, k: int) -> int:
    """Component k's shuffle seed (k = 0 keeps DataConfig.seed: one dataset shuffles as raw)."""
    return seed if k == 0 else int(np.random.SeedSequence([seed, k]).generate_state(1)[0])


def single(cfg: DataConfig, split: str) -> grain.MapDataset:
    """The split of the only prepared dataset (the caller shuffles and repeats)."""
    return grain.MapDataset.source(_open(cfg, split)[0][0])


def _tag(k: int):
    def tag(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return element | {SOURCE: np.full(len(element["tokens"]), k + 1, np.int32)}

    return tag


def train_mixture(cfg: DataConfig) -> grain.MapDataset:
    """An infinite mixture of every prepared dataset's training chunks, tagged with `source`."""
    parts = _open(cfg, "train")
    components = []
    for k, (source, _) in enumerate(parts):
        ds = grain.MapDataset.source(source)
        if cfg.shuffle:
            ds = ds.shuffle(component_seed(cfg.seed, k))
        components.append(ds.repeat().map(_tag(k)))
    return grain.MapDataset.mix(components, _weights(cfg, [m for _, m in parts]))


def eval_mixture(cfg: DataConfig) -> grain.MapDataset:
    """The validation chunks of every prepared dataset in order, mixed with the same weights."""
    parts = _open(cfg, "validation")
    components = [grain.MapDataset.source(s) for s, _ in parts]
    return grain.MapDataset.mix(components, _weights(cfg, [m for _, m in parts]))


class SourceShares(grain.IterDataset):
    """Batches without their `source` key; the iterator counts loss tokens per dataset."""

    def __init__(self, parent: grain.IterDataset, names: list[str]) -> None:
        super().__init__(parent)
        self._names = names

    def __iter__(self) -> _SharesIterator:
        return _SharesIterator(self._parent.__iter__(), self._names)


class _SharesIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, names: list[str]) -> None:
        super().__init__(parent)
        self._names = names
        self._tokens = [0] * len(names)

    def __next__(self) -> dict[str, np.ndarray]:
        batch = dict(next(self._parent))
        source = batch.pop(SOURCE)
        counts = np.bincount(source[batch["loss_mask"] > 0], minlength=len(self._names) + 1)
        self._tokens = [t + int(c) for t, c in zip(self._tokens, counts[1:], strict=True)]
        return batch

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._parent.get_state(), "source_tokens": list(self._tokens)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._tokens = [int(t) for t in state["source_tokens"]]

    def metrics(self) -> dict[str, float]:
        """mix/<name>: the share of training loss tokens from each dataset so far."""
        total = max(sum(self._tokens), 1)
        return {f"mix/{n}": t / total for n, t in zip(self._names, self._tokens, strict=True)}
