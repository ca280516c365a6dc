"""benchmarks/spec_timing.py, the timing harness of benchmarks/speculative.py's suite "speed" and
launch/benchmark.py's suite "speculative": every timed call, on the one cache handed from call
to call with its lengths put back, emits what `generate` emits from a fresh cache (plain and
speculative greedy alike); the figures derive from the recorded times and statistics by their
definitions; a cache without room or a speculation the model cannot run is refused before any
compile."""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import randomize_so, tiny_config

from benchmarks import spec_timing
from benchmarks.spec_timing import LoopTiming
from orthros_jax.inference import Speculative, generate, init_cache, prefill
from orthros_jax.inference.speculative import SpecStats
from orthros_jax.model import init_params

# Ragged rows: the lengths put back after each call are each row's own.
PROMPTS = [list(np.random.RandomState(i).randint(0, 64, size=n)) for i, n in enumerate([5, 19])]
NEW, SPEC = 12, Speculative(3, 4)


@pytest.fixture(scope="module")
def model():
    cfg = tiny_config(vocab_size=64)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(1))
    return cfg, randomize_so(params, 3, 0.5)  # the streams differ: some drafts get rejected


def _prefilled(cfg, params, slots):
    lens = np.array([len(p) for p in PROMPTS])
    tokens = np.zeros((len(PROMPTS), lens.max()), np.int64)
    for i, p in enumerate(PROMPTS):
        tokens[i, : len(p)] = p
    return prefill(params, init_cache(cfg, len(PROMPTS), slots), tokens, lens, cfg)


def test_every_call_on_the_handed_cache_emits_generates_tokens(model):
    cfg, params = model
    slots = spec_timing.cache_slots(max(map(len, PROMPTS)), NEW, SPEC)
    assert slots == 128  # 19 + 12 + 3 + 2 = 36, rounded up as generate's default cache is
    logits, cache = _prefilled(cfg, params, slots)
    t = spec_timing.time_loops(params, cache, logits, cfg, SPEC, new_tokens=NEW, repeats=2)
    # The last calls (the third of each loop on the same cache) against fresh-cache generate.
    plain = generate(params, PROMPTS, cfg, max_new_tokens=NEW)
    spec = generate(params, PROMPTS, cfg, max_new_tokens=NEW, speculative=SPEC)
    np.testing.assert_array_equal(t.plain_tokens, plain.tokens)
    np.testing.assert_array_equal(t.spec_tokens, spec.tokens)
    for name in ("rounds", "drafted", "accepted"):
        np.testing.assert_array_equal(getattr(t.stats, name), getattr(spec.speculation, name))
    assert t.identical is True
    s = t.stats
    assert 0 < s.accepted.sum() < s.drafted.sum(), "the test needs accepted and rejected drafts"
    # The figures, by their definitions, from the recorded times.
    for arm in (t.plain, t.speculative):
        assert arm["repeats"] == 2 and len(arm["times_s"]) == 2
        assert arm["median_s"] == statistics.median(arm["times_s"]) > 0
    per_round = [p / q for p, q in zip(t.plain["times_s"], t.speculative["times_s"], strict=True)]
    np.testing.assert_allclose(t.measured_ratio, statistics.median(per_round), rtol=1e-12, atol=0)
    np.testing.assert_allclose(t.plain_tok_s, 2 * 11 / t.plain["median_s"], rtol=1e-12, atol=0)
    np.testing.assert_allclose(t.spec_tok_s, 2 * 11 / t.speculative["median_s"], rtol=1e-12, atol=0)
    step, rounds = t.plain["median_s"] / 11, t.speculative["median_s"] / s.rounds.max()
    np.testing.assert_allclose(t.round_over_step, rounds / step, rtol=1e-12, atol=0)
    np.testing.assert_allclose(t.slowest_row_rounds, s.rounds.max() / s.rounds.mean(), rtol=1e-12)


def test_statistics_and_the_identical_check_hand_values():
    s = SpecStats(rounds=np.array([3, 5]), drafted=np.array([9, 12]), accepted=np.array([6, 2]))
    assert s.tokens_per_verify() == (8 + 8) / 8
    assert s.acceptance_rate() == 8 / 21
    none = SpecStats(*(np.zeros(2, np.int32),) * 3)  # no round ran: 0, not a division by 0
    assert none.tokens_per_verify() == 0 and none.acceptance_rate() == 0
    timing = {"median_s": 1.0, "times_s": [1.0]}
    a, b = np.array([[1, 2, -1]]), np.array([[1, 3, -1]])
    make = lambda x, y, greedy: LoopTiming(timing, timing, 1.0, s, x, y, greedy)  # noqa: E731
    assert make(a, a, True).identical is True
    assert make(a, b, True).identical is False
    assert make(a, b, False).identical is None  # sampled: the loops make different draws
    assert make(a, a, True).decode_tokens == 2  # the first token is the prefill's


def test_a_cache_without_room_or_a_speculation_it_cannot_run_is_refused(model):
    cfg, params = model
    logits = jnp.zeros((1, cfg.vocab_size), jnp.float32)
    cache = init_cache(cfg, 1, 20).replace(lengths=jnp.array([4], jnp.int32))
    with pytest.raises(ValueError, match="cache of 20 slots; .* need 21"):  # 4 + 12 + 3 + 2
        spec_timing.time_loops(params, cache, logits, cfg, SPEC, new_tokens=NEW, repeats=1)
    cache = init_cache(cfg, 1, 128)
    with pytest.raises(ValueError, match="draft_window=200 exceeds the cache"):
        spec = Speculative(3, 200)
        spec_timing.time_loops(params, cache, logits, cfg, spec, new_tokens=NEW, repeats=1)


@pytest.mark.slow
def test_engine_runs_refill_slots_and_count_only_full_decode_steps(model):
    """benchmarks/spec_engine.py: plain and speculative engines emit the same greedy tokens
    (each request's own, as generate emits them); only steps that prefill nothing while every
    slot decodes are counted."""
    from benchmarks import spec_engine

    cfg, params = model
    prompts = np.stack([np.random.RandomState(i).randint(0, 64, size=11) for i in range(3)])
    kw = dict(batch=2, max_len=128, chunk=16)
    plain_engine = spec_engine.engine_for(params, cfg, steps=3, spec=None, **kw)
    spec_engine_ = spec_engine.engine_for(params, cfg, steps=1, spec=SPEC, **kw)
    plain = spec_engine.run_engine(plain_engine, prompts, new=NEW, temperature=0.0)
    spec = spec_engine.run_engine(spec_engine_, prompts, new=NEW, temperature=0.0)
    want = generate(params, list(prompts), cfg, max_new_tokens=NEW).tokens
    assert plain.tokens == spec.tokens == want.tolist()
    assert plain.rounds == 0 and 0 < spec.accepted < spec.drafted
    assert spec.emitted == 3 * (NEW - 1)  # every decoded token came from a round
    for run in (plain, spec):
        # 3 requests on 2 slots: the third is admitted, and prefilled, once a slot frees.
        assert 0 < run.counted_steps < run.steps
        assert 0 < run.counted_tokens < 3 * (NEW - 1)
