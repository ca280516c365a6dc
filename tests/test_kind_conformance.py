"""Every registered kind through the model's entry points, in a pure stack, a hybrid cycle with
attention and a two-stream (orthros_h) cycle (cases from tests/conformance.py): PT and SFT on
packed rows, cached prefill (ragged, in one call or continued over calls) + decode against the
forward, and greedy decoding three ways (the serving engine, `generate`, argmax of the
forward) against each other. Registering a kind (and its conformance.profile entry) runs it
through all of this."""

from __future__ import annotations

import numpy as np
import pytest
from conformance import FAST_LAYOUT, LEN, ROWS, case_params, model, tokens

from orthros_jax import inference as inf
from orthros_jax.inference import sampling
from orthros_jax.serving import device
from orthros_jax.serving.engine import Engine
from orthros_jax.serving.requests import SamplingParams

CASES = pytest.mark.parametrize("case", case_params())
# The decode loop and the engine run a kind through the same cache code in every layout (the
# layouts differ in the forward, which CASES checks): the two-stream layout, which drives every
# path (two streams, and for a recurrent kind attention beside it), and the MoE cases.
TWO_STREAM = pytest.mark.parametrize("case", case_params(layouts=(FAST_LAYOUT,)))

ATOL = 1e-5  # fp32 cached path against the forward (DESIGN's invariant)
LENGTHS = np.array([1, 5, 9, 17])  # ragged prompts over 1-3 prefill chunks of 6
# A prompt continued over two prefill calls: the first ends at FIRST, the second (starting mid
# prefill chunk and mid kernel chunk, and running over 1-3 chunks) at ENDS.
FIRST, ENDS = np.array([13, 2, 4, 11]), np.array([14, 15, 9, 17])
N_DECODE = 4
CACHE = 32  # slots per row of every cache here (prefill + decode, and generate's)
assert ROWS == len(LENGTHS) and LEN == LENGTHS.max() + N_DECODE and ENDS.max() <= LENGTHS.max()
# inference.prefill pads a call's tokens to the bucket of its longest prompt (prompt_bucket:
# multiples of the prefill chunk 6 above it): every prefill call here (in one call, both
# continued ones, generate's) has its longest prompt in 13..18, one bucket of 18, so a case
# compiles one prefill program (and one decode) for its caches of [ROWS, CACHE].
BUCKET = (13, 18)

# Greedy decoding three ways: 5 requests for the engine's 3 slots (two wait for a free slot,
# rows are reused), the first over 3 prefill steps of 6; each prompt + its new tokens fits the
# forward's LEN (argmax decoding runs on it).
PROMPT_LENS = (14, 3, 9, 1, 12)
NEW_TOKENS = (6, 9, 4, 7, 5)
ENGINE = dict(max_batch=3, max_len=CACHE, prefill_batches=(3,))  # one prefill program
assert all(p + n <= LEN for p, n in zip(PROMPT_LENS, NEW_TOKENS, strict=True))
assert BUCKET[0] <= max(PROMPT_LENS[:ROWS]) <= BUCKET[1]


def _packed(cfg, seed: int):
    """Two rows of 14 packing documents of 7 + 6 (+ 1 padding token) and 9 + 5 tokens, and the
    documents alone, each in its own row from position 0 (right-padded)."""
    docs = [tokens(cfg, 1, n, seed + i)[0] for i, n in enumerate((7, 6, 9, 5))]
    row0 = np.concatenate([docs[0], docs[1], [0]])
    row1 = np.concatenate([docs[2], docs[3]])
    pos = np.stack([np.r_[np.arange(7), np.arange(6), 0], np.r_[np.arange(9), np.arange(5)]])
    seg = np.stack([np.r_[np.ones(7), np.full(6, 2), 0], np.r_[np.ones(9), np.full(5, 2)]])
    alone = np.zeros((4, 14), np.int64)
    for i, d in enumerate(docs):
        alone[i, : len(d)] = d
    spans = [(0, 0, 7, 0), (1, 0, 6, 7), (2, 1, 9, 0), (3, 1, 5, 9)]  # (doc, row, len, start)
    return np.stack([row0, row1]), pos.astype(np.int32), seg.astype(np.int32), alone, spans


@pytest.mark.slow
@CASES
def test_pt_and_sft_on_packed_rows(case):
    """PT on packed rows: finite [B, T, V] logits, each document's equal to it alone (window 5
    < 7: the windows stay inside documents too); SFT at unsorted output positions of the
    packed rows: [B, T_out, V], the PT logits there."""
    cfg, params, forward = model(case)
    packed, pos, seg, alone, spans = _packed(cfg, seed=6)
    pt = forward(packed, positions=pos, segment_ids=seg)
    assert pt.shape == (2, 14, cfg.vocab_size) and np.isfinite(pt).all()
    solo = forward(alone)
    for doc, row, n, start in spans:
        np.testing.assert_allclose(pt[row, start : start + n], solo[doc, :n], atol=ATOL, rtol=0)
    idx = np.array([[9, 2, 13, 5, 6], [0, 11, 7, 8, 13]])
    sft = forward(packed, positions=pos, segment_ids=seg, output_positions=idx)
    assert sft.shape == (2, 5, cfg.vocab_size)
    np.testing.assert_allclose(sft, pt[np.arange(2)[:, None], idx], atol=ATOL, rtol=0)


def _check_decode(cfg, params, cache, full, want, lengths) -> None:
    """N_DECODE decode steps after `lengths` tokens, each against the forward's logits."""
    rows = np.arange(len(lengths))
    for i in range(N_DECODE):
        got, cache = inf.decode_step(params, cache, full[rows, lengths + i], cfg)
        np.testing.assert_allclose(
            np.asarray(got), want[rows, lengths + i], atol=ATOL, rtol=0, err_msg=f"decode {i}"
        )


@pytest.mark.slow
@CASES
def test_prefill_and_decode_equal_the_forward(case):
    """Ragged prompts prefilled in one call, and the same prompts continued over two calls
    (the second starts mid prefill chunk and mid kernel chunk), then decode steps: every
    logit equals the PT forward's at its position (fp32, <= 1e-5)."""
    cfg, params, forward = model(case)
    for lens in (LENGTHS, FIRST, ENDS - FIRST):  # one compiled prefill (BUCKET)
        assert inf.prompt_bucket(int(lens.max()), cfg) == BUCKET[1], lens
    rows = np.arange(len(LENGTHS))
    full = tokens(cfg, len(LENGTHS), int(LENGTHS.max()) + N_DECODE)
    want = forward(full)
    prompts = np.where(np.arange(full.shape[1])[None] < LENGTHS[:, None], full, -1)
    cache = inf.init_cache(cfg, len(LENGTHS), CACHE)
    got, cache = inf.prefill(params, cache, prompts, LENGTHS, cfg)
    np.testing.assert_allclose(np.asarray(got), want[rows, LENGTHS - 1], atol=ATOL, rtol=0)
    _check_decode(cfg, params, cache, full, want, LENGTHS)

    cache = inf.init_cache(cfg, len(LENGTHS), CACHE)
    got, cache = inf.prefill(params, cache, full[:, : FIRST.max()], FIRST, cfg)
    np.testing.assert_allclose(np.asarray(got), want[rows, FIRST - 1], atol=ATOL, rtol=0)
    rest = np.zeros((len(ENDS), int((ENDS - FIRST).max())), np.int64)
    for r in rows:
        rest[r, : ENDS[r] - FIRST[r]] = full[r, FIRST[r] : ENDS[r]]
    got, cache = inf.prefill(params, cache, rest, ENDS - FIRST, cfg)
    np.testing.assert_allclose(np.asarray(got), want[rows, ENDS - 1], atol=ATOL, rtol=0)
    _check_decode(cfg, params, cache, full, want, ENDS)


def _argmax_decoding(forward, prompts, new_tokens) -> list[list[int]]:
    """Greedy continuations by argmax of the forward's logits, ROWS prompts per call."""
    out = []
    for at in range(0, len(prompts), ROWS):
        batch, steps = prompts[at : at + ROWS], new_tokens[at : at + ROWS]
        lens = np.array([len(p) for p in batch])
        seqs = np.zeros((len(batch), LEN), np.int64)
        for r, p in enumerate(batch):
            seqs[r, : len(p)] = p
        for i in range(max(steps)):
            rows = np.flatnonzero(i < np.array(steps))  # rows still generating
            seqs[rows, lens[rows] + i] = forward(seqs)[rows, lens[rows] + i - 1].argmax(-1)
        out += [seqs[r, lens[r] : lens[r] + steps[r]].tolist() for r in range(len(batch))]
    return out


@pytest.mark.slow
@TWO_STREAM
def test_engine_and_generate_equal_argmax_decoding(case):
    """Greedy decoding three ways agrees token for token: argmax of the forward's logits,
    `generate` (on the first ROWS prompts), and the serving engine (5 requests for 3 slots
    arriving over time, prompts over 1-3 prefill steps, rows reused, two requests waiting),
    which compiles nothing in steady state and ends every request for its length."""
    cfg, params, forward = model(case)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in PROMPT_LENS]
    want = _argmax_decoding(forward, prompts, NEW_TOKENS)

    out = inf.generate(
        params,
        prompts[:ROWS],
        cfg,
        max_new_tokens=max(NEW_TOKENS[:ROWS]),
        sampler=sampling.greedy(),
        cache_size=CACHE,
    )
    for k in range(ROWS):
        assert out.tokens[k, : NEW_TOKENS[k]].tolist() == want[k], f"generate, prompt {k}"

    chunk = dict(chunk_budget=cfg.prefill_chunk, prefill_lengths=(cfg.prefill_chunk,))
    engine = Engine(params, cfg, **(ENGINE | chunk))
    engine.warmup()
    compiled = device.compile_count()
    got: list[list] = [[] for _ in prompts]

    def submit(k: int) -> None:
        params_k = SamplingParams(max_tokens=NEW_TOKENS[k], temperature=0.0)
        engine.submit(prompts[k], params_k, got[k].append)

    submit(0)
    engine.step()  # request 0 is mid-prompt when 1 and 2 arrive
    submit(1), submit(2)
    engine.step(), engine.step()
    submit(3), submit(4)  # these wait for free slots
    assert len(engine.queue) == 2 and all(engine.slots)
    for _ in range(500):
        if not engine.busy():
            break
        engine.step()
    assert not engine.busy(), "engine did not finish"
    assert device.compile_count() == compiled, "the engine compiled in steady state"
    for k, events in enumerate(got):
        toks = [e.token for e in events if e.kind == "token"]
        assert toks == want[k], f"engine, request {k}"
        assert events[-1].kind == "done" and events[-1].finish_reason == "length", k
