"""The continuous-batching engine (orthros_jax/serving): greedy through the engine equals
`generate` for every arm with requests arriving over time, so does seeded sampling (the same
loop and sampler, the same sampling log-probs), stops, cancellation, faults, the bounded queue, and
no compile in steady state."""

from __future__ import annotations

import time

import conformance
import jax
import numpy as np
import pytest
from serving_helpers import ENGINE_SHAPE, NEW_TOKENS, PROMPT_LENS, arm_model

from orthros_jax import inference
from orthros_jax.config import ARCHITECTURES
from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.inference import sampling
from orthros_jax.serving import device
from orthros_jax.serving.engine import Engine
from orthros_jax.serving.requests import RequestError, SamplingParams
from orthros_jax.serving.text import TextStream


class Collect:
    """An on_event callback that records a request's events."""

    def __init__(self) -> None:
        self.events = []

    def __call__(self, ev) -> None:
        self.events.append(ev)

    @property
    def tokens(self) -> list[int]:
        return [e.token for e in self.events if e.kind == "token"]

    @property
    def done(self):
        return next((e for e in self.events if e.kind in ("done", "error")), None)


def _engine(params, cfg, **kw) -> Engine:
    """The tests' engine shape (3 slots of 40, chunks of 8): tests sharing it share compiles."""
    return Engine(params, cfg, **(ENGINE_SHAPE | kw))


def _run(engine: Engine, max_steps: int = 500) -> None:
    for _ in range(max_steps):
        if not engine.busy():
            return
        engine.step()
    raise AssertionError("engine did not finish")


# Every kind in every arm: test_kind_conformance.py; here the arms it does not build, and
# several decode steps per call.
COVERED = {conformance.config(case).architecture for case in conformance.cases()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,decode_steps",
    [(a, 1) for a in ARCHITECTURES if a not in COVERED] + [("orthros", 3), ("hybrid", 3)],
)
def test_greedy_engine_matches_generate_with_arrivals_over_time(arch, decode_steps):
    cfg, params = arm_model(arch)
    rng = np.random.default_rng(0)
    # 5 requests, 3 slots: slots are reused (their rows reset); 21 tokens span 3 prefill steps.
    lens, news = PROMPT_LENS, NEW_TOKENS
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in lens]
    engine = _engine(params, cfg, decode_steps=decode_steps)
    engine.warmup()
    compiled = device.compile_count()
    got = [Collect() for _ in prompts]
    greedy = lambda n: SamplingParams(max_tokens=n, temperature=0.0)
    engine.submit(prompts[0], greedy(news[0]), got[0])
    engine.step()  # request 0 is mid-prompt when 1 and 2 arrive
    for k in (1, 2):
        engine.submit(prompts[k], greedy(news[k]), got[k])
    engine.step()
    engine.step()
    for k in (3, 4):  # these wait for free slots
        engine.submit(prompts[k], greedy(news[k]), got[k])
    _run(engine)
    assert device.compile_count() == compiled, "the engine compiled in steady state"
    want = inference.generate(params, prompts, cfg, max_new_tokens=max(news)).tokens
    for k in range(len(prompts)):
        assert got[k].tokens == want[k, : news[k]].tolist(), k
        assert got[k].done.finish_reason == "length" and got[k].done.completion_tokens == news[k]


class Recording:
    """The engine's device calls (engine._dev), recording what each returned."""

    def __init__(self, dev) -> None:
        self.dev, self.prefills, self.decodes = dev, [], []

    def prefill_rows(self, params, cache, hist, rows, *args, **kw):
        sampled, cache, hist = self.dev.prefill_rows(params, cache, hist, rows, *args, **kw)
        self.prefills.append((np.asarray(rows), jax.device_get(sampled)))
        return sampled, cache, hist

    def decode_rows(self, *args, **kw):
        sampled, fed, cache, hist = self.dev.decode_rows(*args, **kw)
        self.decodes.append((np.asarray(fed), jax.device_get(sampled)))
        return sampled, fed, cache, hist


@pytest.mark.slow
def test_sampled_engine_matches_generate_row_by_row():
    """One loop, one sampler: request i with generate's seed for row i (sampling.row_seeds)
    samples what generate samples for row i, with the same sampling log-probs."""
    cfg, params = arm_model("orthros")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (11, 4, 7)]
    sampler, key, n = sampling.Sampler(1.0, 0, 0.9), jax.random.PRNGKey(5), 9
    want = inference.generate(params, prompts, cfg, max_new_tokens=n, sampler=sampler, rng=key)
    assert (want.logprobs < 0).any(), "nothing sampled below probability 1"
    seeds = np.asarray(sampling.row_seeds(key, len(prompts)))
    engine = _engine(params, cfg, decode_steps=3)
    engine._dev = rec = Recording(engine._dev)
    got = [Collect() for _ in prompts]
    for i, p in enumerate(prompts):
        sp = SamplingParams(max_tokens=n, temperature=1.0, top_p=0.9, seed=int(seeds[i]))
        engine.submit(p, sp, got[i])
    _run(engine)
    for i in range(len(prompts)):
        assert got[i].tokens == want.tokens[i].tolist(), i
    # Each request's log-probs in the order the device calls returned them (request i is in
    # slot i): its first token from its last prefill chunk, then the fed decode steps.
    first = {}
    for rows, sampled in rec.prefills:
        for j, row in enumerate(rows):
            if row < len(prompts):  # not a padding row
                first[row] = sampled.sample_logprob[j]
    logprobs = [[first[i]] for i in range(len(prompts))]
    for fed, sampled in rec.decodes:
        for k, b in zip(*np.nonzero(fed), strict=True):
            logprobs[b].append(sampled.sample_logprob[k, b])
    for i in range(len(prompts)):
        np.testing.assert_allclose(logprobs[i], want.logprobs[i], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_seeded_sampling_is_reproducible_and_independent_of_the_batch():
    cfg, params = arm_model("orthros")
    prompt = list(range(30, 42))
    sp = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=7)
    runs = []
    # alone, then beside two other sampled requests with 3 decode steps per call
    for neighbours, steps in ((0, 1), (2, 3)):
        engine = _engine(params, cfg, decode_steps=steps)
        for k in range(neighbours):
            engine.submit(
                list(range(k + 3)), SamplingParams(max_tokens=12, temperature=1.0), Collect()
            )
        runs.append(Collect())
        engine.submit(prompt, sp, runs[-1])
        _run(engine)
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 12
    other = Collect()
    engine.submit(prompt, SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=8), other)
    _run(engine)
    assert other.tokens != runs[0].tokens


@pytest.mark.slow
@pytest.mark.parametrize("decode_steps", [1, 4])
def test_stops_strings_ids_and_capacity(decode_steps):
    cfg, params = arm_model("orthros")
    tok = ByteTokenizer()
    prompt = list(b"hello, world! " * 3)[:33]
    free = inference.generate(params, [prompt], cfg, max_new_tokens=10).tokens[0].tolist()
    engine = _engine(params, cfg, decode_text=tok.decode, eos_id=free[3], decode_steps=decode_steps)
    by_eos, ignore, by_string, by_cap = Collect(), Collect(), Collect(), Collect()
    engine.submit(prompt, SamplingParams(max_tokens=10, temperature=0.0), by_eos)
    stop = tok.decode(free[1:3])
    engine.submit(
        prompt,
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, stop=(stop,)),
        by_string,
    )
    _run(engine)
    engine.submit(prompt, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True), by_cap)
    engine.submit(prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), ignore)
    _run(engine)
    if free[3] not in free[:3]:
        assert by_eos.tokens == free[:3] and by_eos.done.finish_reason == "stop"
    text = "".join(e.text for e in by_string.events)
    assert text == tok.decode(free[:1]) and by_string.done.finish_reason == "stop"
    # 40 slots, a 33-token prompt: 7 fed tokens + the last one sampled = 8 tokens, then full.
    assert by_cap.tokens == free[:8] and by_cap.done.finish_reason == "length"
    assert ignore.tokens == free[:2] and ignore.done.finish_reason == "length"


def test_cancel_frees_the_slot_and_a_failing_request_fails_alone():
    cfg, params = arm_model("orthros")
    engine = _engine(params, cfg, max_queue=2)
    long_ones, waiting = [Collect() for _ in range(3)], Collect()
    reqs = [
        engine.submit(list(range(5)), SamplingParams(max_tokens=30, temperature=0.0), c)
        for c in long_ones[:2]
    ]
    engine.step()
    reqs.append(
        engine.submit(list(range(5)), SamplingParams(max_tokens=30, temperature=0.0), long_ones[2])
    )
    engine.submit(list(range(6)), SamplingParams(max_tokens=3, temperature=0.0), waiting)
    engine.step()  # every slot busy: the last request waits
    assert [s.req for s in engine.slots] == reqs and len(engine.queue) == 1
    engine.cancel(reqs[0])
    engine.step()  # the slot is freed and the waiting request admitted in the same step
    assert long_ones[0].done.finish_reason == "cancelled" and engine.slots[0].req.ids == list(
        range(6)
    )
    for r in reqs[1:]:
        engine.cancel(r)
    _run(engine)
    assert waiting.done.finish_reason == "length" and len(waiting.tokens) == 3

    def boom(ev):
        raise RuntimeError("client callback broke")

    fine = Collect()
    engine2 = _engine(params, cfg, max_queue=2)
    engine2.submit(list(range(7)), SamplingParams(max_tokens=4, temperature=0.0), boom)
    engine2.submit(list(range(8)), SamplingParams(max_tokens=4, temperature=0.0), fine)
    with pytest.raises(RequestError) as err:  # the queue holds two requests
        engine2.submit([1], SamplingParams(), Collect())
    assert err.value.status == 429
    _run(engine2)
    assert fine.done.finish_reason == "length" and len(fine.tokens) == 4
    assert engine2.metrics.requests["error"] == 1 and not engine2.busy()


def test_text_stream_holds_back_stop_prefixes_and_partial_characters():
    tok = ByteTokenizer()
    ts = TextStream(tok.decode, stops=("END",))
    shown = [ts.add(b) for b in "héllo EN".encode()]
    assert "".join(shown) == "héllo " and shown[1] == ""  # é's first byte held back
    assert ts.add(ord("D")) == "" and ts.stopped and ts.finish() == ""
    ts = TextStream(tok.decode, stops=("END",))
    assert "".join(ts.add(b) for b in b"a EN") == "a " and ts.finish() == "EN"


@pytest.mark.slow
def test_an_idle_engine_gathers_a_burst_into_one_prefill(monkeypatch):
    cfg, params = arm_model("orthros")
    with pytest.raises(ValueError, match="batch_wait_s must be in"):
        _engine(params, cfg, batch_wait_s=-1)
    calls = []
    real = device.prefill_rows

    def spy(params, cache, hist, rows, *args, **kw):
        calls.append(int((np.asarray(rows) < 3).sum()))  # real rows (ids < max_batch)
        return real(params, cache, hist, rows, *args, **kw)

    monkeypatch.setattr(device, "prefill_rows", spy)
    # 3 slots, chunks of 8: three 2-token prompts fit one call; the wait ends when all slots fill
    engine = _engine(params, cfg, batch_wait_s=1.0)
    engine.start()
    got = [Collect() for _ in range(3)]
    try:
        for k, c in enumerate(got):  # 50 ms apart: without the wait, the first runs alone
            engine.submit([1 + k, 2], SamplingParams(max_tokens=2, temperature=0.0), c)
            time.sleep(0.05)
        deadline = time.time() + 120
        while not all(c.done for c in got) and time.time() < deadline:
            time.sleep(0.01)
    finally:
        engine.shutdown()
    assert all(c.done.finish_reason == "length" for c in got)
    assert calls == [3], calls  # one prefill call held all three prompts
