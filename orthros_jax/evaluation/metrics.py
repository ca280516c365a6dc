"""Metrics: held-out NLL / bits-per-byte, recall accuracy, NIAH grids and heatmaps.

    lm = lm_metrics(cfg, params, make_eval_batches(data_cfg, 8), tokenizer)   # nll, bpb, ...
    recs = recall_records(cfg, params, examples, decode="teacher_forced")      # one per example
    summary = summarize_records(recs)                                          # accuracy, ...
    acc_LD = grid_matrix(recs, lengths, depths)                                # [lengths, depths]
    plot_heatmap(acc_LD, lengths, depths, "niah.png", title="orthros")

Recall is scored per *query* (a MQAR example asks several, passkey one): a query is right
when every token of its answer is right. Two ways to get the predicted tokens:

* "teacher_forced": one SFT forward with output copies at the answer-predicting positions;
  the prediction is argmax of the logits there, given the true earlier tokens. Cheap, one
  compile per sequence length.
* "greedy": prefill the prompt and decode len(answer) tokens with inference.generate (the
  serving path: KV cache, prefill + decode_step).

A query's greedy answer is all right exactly when its teacher-forced argmaxes are all right
(each greedy step then sees the true prefix), so the two agree on query accuracy up to
float ties; token accuracy can differ (greedy goes off track after the first error).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orthros_jax.config import ModelConfig
from orthros_jax.data import RecallExample, SFTExample, examples_to_batch
from orthros_jax.data.tokenizers import ByteTokenizer, Tokenizer
from orthros_jax.model import OrthrosLM, Params

DECODES: tuple[str, ...] = ("teacher_forced", "greedy")


# ---------------------------------------------------------------- pure metric functions


def masked_nll_sums(
    logits: jax.Array, targets: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(nll_sum, correct_sum, weight) over entries with mask > 0, in float32.

    logits [B, L, V], targets [B, L] int, mask [B, L]. nll is -log softmax(logits)[target]
    (natural log); correct counts argmax(logits) == target.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    m = mask.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return jnp.sum(nll * m), jnp.sum(correct * m), jnp.sum(m)


def bits_per_byte(nll_sum: float, n_bytes: float) -> float:
    """Total NLL in nats over the bytes of text it predicts, in bits per byte."""
    return float(nll_sum) / math.log(2.0) / max(float(n_bytes), 1.0)


def token_bytes(tokenizer: Tokenizer, vocab_size: int) -> np.ndarray:
    """UTF-8 bytes each token id stands for [V] (float32); 1 everywhere for bytes.

    For a subword tokenizer this decodes ids one by one, so a token holding part of a
    multi-byte character counts its replacement character: an approximation, stated here.
    """
    if isinstance(tokenizer, ByteTokenizer):
        return np.ones(vocab_size, np.float32)
    out = np.ones(vocab_size, np.float32)
    for i in range(min(vocab_size, tokenizer.vocab_size)):
        out[i] = max(1, len(tokenizer.decode([i]).encode("utf-8")))
    return out


def query_correct(token_correct: np.ndarray, answer_lengths: Sequence[int]) -> np.ndarray:
    """Per-query exact match [Q] bool from per-answer-token correctness [sum(answer_lengths)]
    (the answer tokens of consecutive queries, in order)."""
    if int(np.sum(answer_lengths)) != len(token_correct):
        raise ValueError(
            f"{len(token_correct)} answer tokens but the answers have {sum(answer_lengths)}"
        )
    bounds = np.cumsum([0, *answer_lengths])
    return np.array(
        [bool(np.all(token_correct[a:b])) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    )


# ---------------------------------------------------------------- language modelling


@functools.partial(jax.jit, static_argnames="cfg")
def _lm_sums(params: Params, batch: Mapping[str, jax.Array], byte_table: jax.Array, cfg):
    """Sums of one PT batch: nll (nats), correct argmaxes, target tokens, target bytes."""
    logits = OrthrosLM(cfg).apply(
        {"params": params},
        batch["tokens"],
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
    )
    nll, correct, weight = masked_nll_sums(logits, batch["targets"], batch["loss_mask"])
    n_bytes = jnp.sum(byte_table[batch["targets"]] * batch["loss_mask"])
    return nll, correct, weight, n_bytes


def lm_metrics(
    cfg: ModelConfig,
    params: Params,
    batches: Iterable[Mapping[str, np.ndarray]],
    tokenizer: Tokenizer | None = None,
) -> dict[str, float]:
    """Held-out language-modelling metrics over PT batches (make_eval_batches(kind="pt")).

    Returns nll (nats per token), bpb (bits per UTF-8 byte), perplexity, token_accuracy,
    tokens and bytes scored.
    """
    table = jnp.asarray(token_bytes(tokenizer or ByteTokenizer(), cfg.vocab_size))
    sums = np.zeros(4)
    for batch in batches:
        b = {k: jnp.asarray(batch[k]) for k in ("tokens", "positions", "segment_ids")}
        b |= {
            "targets": jnp.asarray(batch["targets"]),
            "loss_mask": jnp.asarray(batch["loss_mask"]),
        }
        sums += np.asarray(jax.device_get(_lm_sums(params, b, table, cfg=cfg)), np.float64)
    nll_sum, correct, tokens, n_bytes = sums
    if tokens == 0:
        raise ValueError("lm_metrics: the batches hold no target tokens (empty validation split?)")
    nll = nll_sum / tokens
    return {
        "nll": float(nll),
        "bpb": bits_per_byte(nll_sum, n_bytes),
        "perplexity": float(math.exp(min(nll, 700.0))),
        "token_accuracy": float(correct / tokens),
        "tokens": int(tokens),
        "bytes": int(n_bytes),
    }


# ---------------------------------------------------------------- recall


@functools.partial(jax.jit, static_argnames="cfg")
def _answer_argmax(params: Params, batch: Mapping[str, jax.Array], cfg) -> jax.Array:
    """argmax token [B, T_out] at the output positions of an SFT batch."""
    logits = OrthrosLM(cfg).apply(
        {"params": params},
        batch["tokens"],
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        output_positions=batch["output_positions"],
    )
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def answer_tokens(example: RecallExample) -> np.ndarray:
    """The answer tokens of all of an example's queries, in order [A]."""
    return example.tokens[example.answer_mask]


def teacher_forced_predictions(
    cfg: ModelConfig, params: Params, examples: Sequence[RecallExample], batch_size: int = 16
) -> list[np.ndarray]:
    """Per example, the argmax token at each answer-predicting position [A_i] (teacher forcing:
    every prediction sees the true tokens before it).

    Rows are padded to a multiple of 64 tokens and batches to batch_size rows, so a grid
    of a few context lengths compiles a few times.
    """
    out: list[np.ndarray] = []
    for start in range(0, len(examples), batch_size):
        chunk = list(examples[start : start + batch_size])
        sft = [SFTExample(ex.tokens, ex.answer_mask) for ex in chunk]
        sft += [sft[0]] * (batch_size - len(sft))  # filler rows, results dropped
        seq_len = _round_up(max(len(ex.tokens) for ex in chunk), 64)
        out_len = _round_up(max(int(ex.answer_mask.sum()) for ex in chunk), 8)
        batch = examples_to_batch(sft, seq_len, out_len)
        feed = {k: jnp.asarray(v) for k, v in batch.items() if k != "loss_mask"}
        pred = np.asarray(_answer_argmax(params, feed, cfg=cfg))
        for r, ex in enumerate(chunk):
            out.append(pred[r, : int(ex.answer_mask.sum())])
    return out


def greedy_predictions(
    cfg: ModelConfig, params: Params, examples: Sequence[RecallExample], batch_size: int = 16
) -> list[np.ndarray]:
    """Per example, the greedy-decoded answer tokens [A_i], each query decoded from its own
    prompt (earlier true answers stay in the prompt) with inference.generate."""
    from orthros_jax.inference import generate  # local: keeps this module light to import

    queries = [(i, p, a) for i, ex in enumerate(examples) for p, a in ex.queries()]
    per_example: list[list[np.ndarray]] = [[] for _ in examples]
    for start in range(0, len(queries), batch_size):
        chunk = queries[start : start + batch_size]
        width = max(len(a) for _, _, a in chunk)
        longest = max(len(p) for _, p, _ in chunk)
        gen = generate(
            params,
            [p for _, p, _ in chunk],
            cfg,
            max_new_tokens=width,
            cache_size=_round_up(longest + width, 128),
        )
        for row, (i, _, answer) in enumerate(chunk):
            per_example[i].append(gen.tokens[row, : len(answer)])
    return [np.concatenate(parts) for parts in per_example]


def recall_records(
    cfg: ModelConfig,
    params: Params,
    examples: Sequence[RecallExample],
    *,
    decode: str = "teacher_forced",
    batch_size: int = 16,
) -> list[dict[str, Any]]:
    """One record per example: task, context_len, depth, distance, queries, queries_correct,
    answer_tokens, tokens_correct (ints, JSON-ready)."""
    if decode not in DECODES:
        raise ValueError(f"decode={decode!r} is unknown; allowed: {', '.join(DECODES)}")
    if not examples:
        raise ValueError("recall_records: no examples")
    predict = teacher_forced_predictions if decode == "teacher_forced" else greedy_predictions
    records = []
    for ex, pred in zip(examples, predict(cfg, params, examples, batch_size), strict=True):
        tok_ok = pred == answer_tokens(ex)
        lengths = [e - s for s, e in ex.answer_spans]
        q_ok = query_correct(tok_ok, lengths)
        records.append(
            {
                "task": ex.task,
                "context_len": int(ex.context_len),
                "depth": float(ex.depth),
                "distance": int(ex.distance),
                "queries": len(lengths),
                "queries_correct": int(q_ok.sum()),
                "answer_tokens": int(len(tok_ok)),
                "tokens_correct": int(tok_ok.sum()),
            }
        )
    return records


def summarize_records(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """accuracy (query exact match), token_accuracy, examples, queries over the records."""
    queries = sum(r["queries"] for r in records)
    tokens = sum(r["answer_tokens"] for r in records)
    return {
        "accuracy": sum(r["queries_correct"] for r in records) / max(queries, 1),
        "token_accuracy": sum(r["tokens_correct"] for r in records) / max(tokens, 1),
        "examples": len(records),
        "queries": queries,
    }


def grid_matrix(
    records: Sequence[Mapping[str, Any]], lengths: Sequence[int], depths: Sequence[float]
) -> np.ndarray:
    """Query accuracy per (context length, depth) cell [len(lengths), len(depths)]; NaN for
    a cell without records."""
    acc = np.full((len(lengths), len(depths)), np.nan)
    for i, length in enumerate(lengths):
        for j, depth in enumerate(depths):
            cell = [
                r
                for r in records
                if r["context_len"] == length and math.isclose(r["depth"], depth, abs_tol=1e-9)
            ]
            if cell:
                acc[i, j] = summarize_records(cell)["accuracy"]
    return acc


def plot_heatmap(
    acc_LD: np.ndarray,
    lengths: Sequence[int],
    depths: Sequence[float],
    path: str,
    *,
    title: str = "needle in a haystack",
    window: int | None = None,
) -> None:
    """Writes a NIAH heatmap PNG: accuracy [lengths, depths], depth on y, length on x."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 + 0.8 * len(lengths)), 1.4 + 0.5 * len(depths)))
    im = ax.imshow(acc_LD.T, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for i in range(len(lengths)):
        for j in range(len(depths)):
            if not np.isnan(acc_LD[i, j]):
                ax.text(i, j, f"{acc_LD[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title(title + (f" (window {window})" if window else ""))
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
