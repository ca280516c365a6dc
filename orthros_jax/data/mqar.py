"""Zoology-style multi-query associative recall (MQAR) in token space, for training and scoring.

An example of length L with D key-value pairs (Arora et al., "Zoology", 2023) is

    k_1 v_1 k_2 v_2 ... k_D v_D | x x k_3 v_3 x x x x k_1 v_1 x k_D v_D x ...
    \\___ 2D context tokens ___/ \\____________ L - 2D query tokens ____________/

Keys are D distinct ids from [1, V/2), values ids from [V/2, V). Every pair is asked once,
in a random order: the query region has (L - 2D) // 2 two-token slots and a query (k_i v_i)
takes a slot drawn with probability proportional to (slot + 1) ** (power_a - 1) (Zoology's
power law: most queries come soon after the context, a few far away). The other query-region
tokens are random ids from the value half [V/2, V): unlike Zoology (noise from the whole
vocabulary of 8192), a small vocabulary would often repeat a query's key as noise, and the
pair it asks for would be ambiguous; here a key occurs only in its pair and its query. The
model must predict v_i at each query key k_i: only those D tokens are answers (loss, accuracy,
and in Orthros the output-stream copies). Id 0 is never used (padding).

Training rows pack examples of one (L, D) shape drawn from the training grid into seq_len
tokens (segment ids keep them apart, positions restart), so every shape trains in the same
compiled step. Everything is a pure function of (seed, stream, index).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grain
import numpy as np

TRAIN_STREAM, EVAL_STREAM = 0, 1


@dataclasses.dataclass(frozen=True)
class MQARConfig:
    """The MQAR data of a training run. Shapes: rows of seq_len tokens (T), batch_size rows.

    train_lengths x train_pairs: the (L, D) grid rows are drawn from (combinations that do
    not fit, 4D > L, are skipped). vocab_size: V (keys below V/2, values above). tokenizer is
    always None (ids are the tokens; the training loop reads the field)."""

    vocab_size: int = 256
    seq_len: int = 256
    batch_size: int = 16
    train_lengths: tuple[int, ...] = (64, 128, 256)
    train_pairs: tuple[int, ...] = (4, 8, 16)
    power_a: float = 0.01
    seed: int = 0
    tokenizer: None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"mqar.{name} must be a positive int, got {value!r}")
        if not 0.0 < self.power_a <= 1.0:
            raise ValueError(f"mqar.power_a must be in (0, 1] (1 = uniform), got {self.power_a}")
        if not self.shapes():
            raise ValueError(
                f"mqar.train_lengths={self.train_lengths} x train_pairs={self.train_pairs}: no "
                f"shape fits (each needs 4 * pairs <= length <= seq_len={self.seq_len})"
            )
        for length, pairs in self.shapes():
            check_shape(length, pairs, self.vocab_size)
        if self.tokenizer is not None:
            raise ValueError("mqar.tokenizer must be None: MQAR ids are the tokens")

    def shapes(self) -> list[tuple[int, int]]:
        """The (length, pairs) training shapes that fit (4 * pairs <= length <= seq_len)."""
        return [
            (n, d)
            for n in self.train_lengths
            for d in self.train_pairs
            if 4 * d <= n <= self.seq_len and d >= 1
        ]

    @property
    def out_len(self) -> int:
        """Answers of the fullest packed row (T_out of a training batch)."""
        return max((self.seq_len // n) * d for n, d in self.shapes())


@dataclasses.dataclass(frozen=True)
class MQARExample:
    """tokens [L] int32, answer_mask [L] bool (True on the D values a query asks for), and per
    answer (in order) its distance: the query key's index minus the context value's index."""

    tokens: np.ndarray
    answer_mask: np.ndarray
    distances: np.ndarray

    @property
    def answers(self) -> np.ndarray:
        return self.tokens[self.answer_mask]


def check_shape(length: int, pairs: int, vocab_size: int) -> None:
    """ValueError unless an (L, D) example fits: D query slots after 2D context tokens, and D
    distinct keys below V/2."""
    if pairs < 1 or 4 * pairs > length:
        raise ValueError(f"MQAR with {pairs} pairs needs a length >= {4 * pairs}, got {length}")
    if pairs > vocab_size // 2 - 1:
        raise ValueError(
            f"MQAR with {pairs} pairs needs vocab_size >= {2 * (pairs + 1)} (distinct keys "
            f"below vocab_size / 2), got {vocab_size}"
        )


def mqar_example(
    rng: np.random.Generator, length: int, pairs: int, vocab_size: int, power_a: float = 0.01
) -> MQARExample:
    """One random example of `length` tokens with `pairs` key-value pairs (module docstring)."""
    check_shape(length, pairs, vocab_size)
    half = vocab_size // 2
    keys = rng.choice(np.arange(1, half), size=pairs, replace=False)
    values = rng.integers(half, vocab_size, size=pairs)
    tokens = rng.integers(half, vocab_size, size=length)  # noise: value ids only
    tokens[0 : 2 * pairs : 2], tokens[1 : 2 * pairs : 2] = keys, values
    slots = (length - 2 * pairs) // 2
    weight = np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1.0)
    taken = np.sort(rng.choice(slots, size=pairs, replace=False, p=weight / weight.sum()))
    asked = rng.permutation(pairs)
    at = 2 * pairs + 2 * taken  # query key indices, increasing
    tokens[at], tokens[at + 1] = keys[asked], values[asked]
    mask = np.zeros(length, bool)
    mask[at + 1] = True
    return MQARExample(
        tokens=tokens.astype(np.int32),
        answer_mask=mask,
        distances=(at - (2 * asked + 1)).astype(np.int32),
    )


def examples(
    length: int,
    pairs: int,
    n: int,
    vocab_size: int,
    *,
    seed: int,
    stream: int = EVAL_STREAM,
    power_a: float = 0.01,
) -> list[MQARExample]:
    """n examples of one shape, a pure function of (seed, stream, length, pairs)."""
    rng = np.random.default_rng([seed, stream, length, pairs])
    return [mqar_example(rng, length, pairs, vocab_size, power_a) for _ in range(n)]


def train_batch(cfg: MQARConfig, index: int, stream: int = TRAIN_STREAM) -> dict[str, np.ndarray]:
    """Training batch `index`: per row a random grid shape, seq_len // L examples of it packed
    (segment ids 1, 2, ...; positions restart per example; a tail that fits no example is
    segment 0). The SFT batch contract of data.packing."""
    rng = np.random.default_rng([cfg.seed, stream, index])
    shapes = cfg.shapes()
    b, t, t_out = cfg.batch_size, cfg.seq_len, cfg.out_len
    out = {
        "tokens": np.zeros((b, t), np.int32),
        "positions": np.tile(np.arange(t, dtype=np.int32), (b, 1)),
        "segment_ids": np.zeros((b, t), np.int32),
        "output_positions": np.zeros((b, t_out), np.int32),
        "targets": np.zeros((b, t_out), np.int32),
        "loss_mask": np.zeros((b, t_out), np.float32),
    }
    for r in range(b):
        length, pairs = shapes[int(rng.integers(len(shapes)))]
        for s in range(t // length):
            ex = mqar_example(rng, length, pairs, cfg.vocab_size, cfg.power_a)
            at, ans = s * length, slice(s * pairs, (s + 1) * pairs)
            out["tokens"][r, at : at + length] = ex.tokens
            out["positions"][r, at : at + length] = np.arange(length)
            out["segment_ids"][r, at : at + length] = s + 1
            out["output_positions"][r, ans] = at + np.nonzero(ex.answer_mask)[0] - 1
            out["targets"][r, ans] = ex.answers
            out["loss_mask"][r, ans] = 1.0
    return out


def make_train_iterator(cfg: MQARConfig) -> grain.DatasetIterator:
    """An endless, checkpointable iterator of training batches (train_batch 0, 1, ...)."""
    ds = grain.MapDataset.range(2**62).map(lambda i: train_batch(cfg, int(i)))
    return iter(ds.to_iter_dataset())


def eval_batches(cfg: MQARConfig, n: int) -> list[dict[str, np.ndarray]]:
    """n held-out batches (a stream disjoint from training's), for the loop's eval loss."""
    return [train_batch(cfg, i, stream=EVAL_STREAM) for i in range(n)]


def distance_bins(edges: Sequence[int]) -> list[str]:
    """Names of the distance bins that rising edges cut: "<=e0", "e0+1-e1", ..., ">eK"."""
    names = [f"<={edges[0]}"]
    names += [f"{a + 1}-{b}" for a, b in zip(edges[:-1], edges[1:], strict=True)]
    return names + [f">{edges[-1]}"]


def queries_correct(
    examples_: Sequence[MQARExample], predictions: Sequence[np.ndarray]
) -> np.ndarray:
    """Per query of every example, in order: whether its predicted value is the answer."""
    return np.concatenate([p == e.answers for e, p in zip(examples_, predictions, strict=True)])


def accuracy_by_distance(
    examples_: Sequence[MQARExample], ok: np.ndarray, edges: Sequence[int]
) -> dict[str, float | None]:
    """Query accuracy per distance bin (distance_bins(edges) names; None when empty). ok:
    queries_correct(examples_, predictions), one entry per query."""
    dist = np.concatenate([e.distances for e in examples_])
    if len(dist) != len(ok):
        raise ValueError(f"{len(ok)} query results for {len(dist)} queries")
    bins = np.digitize(dist, edges, right=True)
    return {
        name: (float(ok[bins == i].mean()) if (bins == i).any() else None)
        for i, name in enumerate(distance_bins(edges))
    }
