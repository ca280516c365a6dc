"""Synthetic recall tasks: deterministic by seed, answers correct by construction, SFT form."""

from __future__ import annotations

import re

import numpy as np
import pytest

from orthros_jax.data import pipeline, sft
from orthros_jax.data.config import DataConfig
from orthros_jax.data.recall import EVAL_STREAM, TRAIN_STREAM, RecallTask
from orthros_jax.data.tokenizers import ByteTokenizer

TOK = ByteTokenizer()
HOST = {"process_index": 0, "process_count": 1}
WINDOW = 64


def _text(ids) -> str:
    return TOK.decode(np.asarray(ids).tolist())


def _mqar(context_len=8 * WINDOW, **kw) -> RecallTask:
    opts = {"n_pairs": 8, "n_queries": 4, "gap": 2 * WINDOW} | kw
    return RecallTask(TOK, "mqar", context_len=context_len, **opts)


def test_mqar_deterministic_by_seed_and_index():
    task = _mqar()
    a, b = task.sample(7, 3), task.sample(7, 3)
    assert np.array_equal(a.tokens, b.tokens) and a.answer_spans == b.answer_spans
    assert not np.array_equal(a.tokens, task.sample(8, 3).tokens)
    assert not np.array_equal(a.tokens, task.sample(7, 4).tokens)
    assert not np.array_equal(a.tokens, task.sample(7, 3, EVAL_STREAM).tokens)


@pytest.mark.parametrize("seed", range(5))
def test_mqar_answers_found_by_brute_force(seed):
    """Parse the decoded prompt: each query's key occurs once as a pair, far back, with the
    answer."""
    task = _mqar()
    ex = task.sample(seed, 0, TRAIN_STREAM)
    assert ex.tokens.dtype == np.int32 and len(ex.tokens) == 8 * WINDOW == ex.context_len
    assert ex.tokens.max() < 256
    text = _text(ex.tokens)
    assert len(ex.answer_spans) == 4
    first_answer = ex.answer_spans[0][0]
    pairs_text = text[:first_answer]
    for prompt, answer in ex.queries():
        ptext = _text(prompt)
        key = re.search(r" ([a-z]{4})=$", ptext).group(1)
        # Brute force over the context before the queries: all " key=dddd " occurrences.
        hits = [m for m in re.finditer(rf" {key}=(\d{{4}}) ", pairs_text)]
        assert len(hits) == 1, (key, pairs_text)
        assert hits[0].group(1) == _text(answer)
        # The pair ends >= gap tokens before the first query is answered (beyond the window).
        assert first_answer - hits[0].end() >= task.gap > WINDOW
    # Exactly n_pairs pairs in the context, distinct keys; queries ask distinct keys.
    found = re.findall(r" ([a-z]{4})=(\d{4}) ", pairs_text)
    assert len(found) == 8 and len({k for k, _ in found}) == 8
    asked = [re.search(r" ([a-z]{4})=$", _text(p)).group(1) for p, _ in ex.queries()]
    assert len(set(asked)) == 4
    assert ex.distance >= task.gap


def test_mqar_answer_mask_and_prompt_answer():
    ex = _mqar().sample(0, 0)
    mask = ex.answer_mask
    assert mask.sum() == 16 and not mask[: ex.answer_spans[0][0]].any()
    assert np.array_equal(ex.answer, ex.tokens[ex.answer_spans[-1][0] :])
    assert np.array_equal(np.concatenate([ex.prompt, ex.answer]), ex.tokens)


def test_mqar_context_must_fit():
    with pytest.raises(ValueError, match="recall_context"):
        _mqar(context_len=100)
    with pytest.raises(ValueError, match="recall_queries"):
        _mqar(n_queries=9)


@pytest.mark.parametrize("filler", ["fixed", "pydoc"])
def test_passkey_grid_correct_by_construction(filler):
    task = RecallTask(TOK, "passkey", context_len=256, filler=filler)
    lengths, depths = [256, 8 * WINDOW], [0.0, 0.5, 1.0]
    grid = task.grid(lengths, depths, samples=2, seed=1)
    assert len(grid) == 12
    assert [(e.context_len, e.depth) for e in grid[::2]] == [
        (n, d) for n in lengths for d in depths
    ]
    for ex in grid:
        assert len(ex.tokens) == ex.context_len
        text = _text(ex.prompt)
        keys = re.findall(r"The pass key is (\d{5})\.", text)
        assert keys and set(keys) == {_text(ex.answer)}
        assert re.findall(r"\d+", text) == [keys[0], keys[0]]  # the filler has no digits
        assert text.endswith("What is the pass key? The pass key is ")
        # The needle sits at the requested depth of the haystack (up to rounding).
        needle = np.frombuffer(f" The pass key is {keys[0]}.".encode(), np.uint8)
        windows = np.lib.stride_tricks.sliding_window_view(ex.tokens, len(needle))
        at = int(np.nonzero((windows == needle).all(1))[0][0])  # token index, not char index
        hay = len(ex.tokens) - len(task._needle(keys[0])) - len(task.question_ids) - 5
        assert at == round(ex.depth * hay)
    again = task.grid(lengths, depths, samples=2, seed=1)
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(grid, again, strict=True))
    other = task.grid(lengths, depths, samples=2, seed=2)
    assert not all(np.array_equal(a.tokens, b.tokens) for a, b in zip(grid, other, strict=True))


def test_passkey_too_short_context():
    with pytest.raises(ValueError, match="recall_context"):
        RecallTask(TOK, "passkey", context_len=40)


@pytest.mark.parametrize("task_name", ["mqar", "passkey"])
def test_recall_sft_batches(task_name):
    """SFT form: loss and output copies only at answer-predicting positions."""
    cfg = DataConfig(
        kind="sft",
        sft_task=task_name,
        seq_len=8 * WINDOW,
        out_len=16,
        batch_size=2,
        recall_gap=2 * WINDOW,
        seed=3,
    )
    task = sft.recall_task(cfg)
    it = pipeline.make_train_iterator(cfg, **HOST)
    batch = next(it)
    assert batch["tokens"].shape == (2, 8 * WINDOW) and batch["output_positions"].shape == (2, 16)
    candidates = [task.sample(cfg.seed, i, TRAIN_STREAM) for i in range(2)]
    for r in range(2):
        # One example fills a row; rows of a packed set are shuffled, so find which one.
        n = int((batch["segment_ids"][r] > 0).sum())
        (ex,) = [e for e in candidates if np.array_equal(batch["tokens"][r, :n], e.tokens[:n])]
        assert n == np.nonzero(ex.answer_mask)[0][-1]  # the last answer token is not needed
        m = batch["loss_mask"][r] > 0
        assert m.sum() == ex.answer_mask.sum() == task.answer_len()
        pos = batch["output_positions"][r][m]
        assert np.array_equal(pos + 1, np.nonzero(ex.answer_mask)[0])
        assert np.array_equal(batch["targets"][r][m], ex.tokens[ex.answer_mask])
    # Deterministic and resumable like any other training iterator.
    state = it.get_state()
    nxt = next(it)
    it2 = pipeline.make_train_iterator(cfg, **HOST)
    it2.set_state(state)
    assert all(np.array_equal(nxt[k], v) for k, v in next(it2).items())
    # Evaluation uses its own stream: no example shared with training's first rows.
    ev = pipeline.make_eval_batches(cfg, max_batches=1, **HOST)
    assert len(ev) == 1 and not np.array_equal(ev[0]["tokens"], batch["tokens"])


def test_examples_to_batch_for_teacher_forced_scoring():
    task = _mqar()
    examples = [task.sample(0, i, EVAL_STREAM) for i in range(3)]
    batch = sft.examples_to_batch(examples, seq_len=8 * WINDOW, out_len=16)
    for r, ex in enumerate(examples):
        m = batch["loss_mask"][r] > 0
        assert np.array_equal(batch["targets"][r][m], ex.tokens[ex.answer_mask])
        assert np.array_equal(batch["output_positions"][r][m] + 1, np.nonzero(ex.answer_mask)[0])
    with pytest.raises(ValueError, match="out_len"):
        sft.examples_to_batch(examples, seq_len=8 * WINDOW, out_len=8)


def test_recall_config_errors():
    with pytest.raises(ValueError, match="out_len"):
        sft.recall_task(DataConfig(kind="sft", sft_task="mqar", seq_len=512, out_len=8))
    with pytest.raises(ValueError, match="recall_context"):
        sft.recall_task(DataConfig(kind="sft", sft_task="mqar", seq_len=64, out_len=16))
