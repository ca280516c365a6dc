"""Speculative decoding through the serving engine (engine.py with speculative=) and the server:
greedy output equals generate's (so the plain engine's) with continuous batching, the steady
state never compiles, the metrics are sane, streaming stays token by token, penalties /
logit_bias / min_tokens / log-probs act as in plain decode, and bad settings fail by name."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from serving_helpers import ENGINE_SHAPE, NEW_TOKENS, PROMPT_LENS, arm_model
from test_server import NAME, TOK, _server
from test_serving_engine import Collect, _run

from orthros_jax import inference
from orthros_jax.inference import Speculative
from orthros_jax.serving import device
from orthros_jax.serving.engine import Engine
from orthros_jax.serving.metrics import Metrics
from orthros_jax.serving.requests import SamplingParams

GREEDY = lambda n: SamplingParams(max_tokens=n, temperature=0.0)  # noqa: E731


def _serve(engine: Engine, prompts: list[list[int]]) -> list[Collect]:
    """Requests 0 first, 1-2 while 0 prefills, 3-4 waiting for free slots (ENGINE_SHAPE: 3)."""
    got = [Collect() for _ in prompts]
    engine.submit(prompts[0], GREEDY(NEW_TOKENS[0]), got[0])
    engine.step()
    for k in (1, 2):
        engine.submit(prompts[k], GREEDY(NEW_TOKENS[k]), got[k])
    engine.step()
    for k in (3, 4):
        engine.submit(prompts[k], GREEDY(NEW_TOKENS[k]), got[k])
    _run(engine)
    return got


@pytest.mark.slow
def test_speculative_engine_greedy_matches_plain_engine_and_generate():
    cfg, params = arm_model("orthros")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in PROMPT_LENS]
    metrics = Metrics()
    engine = Engine(
        params, cfg, **ENGINE_SHAPE, decode_steps=2, speculative=Speculative(3, 4), metrics=metrics
    )
    engine.warmup()
    compiled = device.compile_count()
    got = _serve(engine, prompts)
    assert device.compile_count() == compiled, "the speculative engine compiled in steady state"
    want = inference.generate(params, prompts, cfg, max_new_tokens=max(NEW_TOKENS)).tokens
    for k, n in enumerate(NEW_TOKENS):
        # generate's: so the plain engine's too (test_serving_engine, the same requests).
        assert got[k].tokens == want[k, :n].tolist(), k
        assert got[k].done.finish_reason == "length" and got[k].done.completion_tokens == n
    r, d, a, e = (
        metrics.spec_rounds,
        metrics.spec_drafted,
        metrics.spec_accepted,
        metrics.spec_emitted,
    )
    assert 0 < r and 0 <= a <= d <= 3 * r, (r, d, a)
    # Each verify emits its accepted drafts and one more; the first token is the prefill's.
    assert e == a + r == sum(NEW_TOKENS) - len(NEW_TOKENS), (e, a, r)
    acceptance, accepted_len, per_verify = metrics.speculation_rates()
    np.testing.assert_allclose(
        (acceptance, accepted_len, per_verify), (a / d, a / r, e / r), rtol=1e-12, atol=0
    )
    page = metrics.render()
    for name in ("acceptance_rate", "mean_accepted_length", "tokens_per_verify"):
        assert f"orthros_spec_{name} " in page, name


def _processed_requests(cfg, params, prompts: list[list[int]]) -> list[SamplingParams]:
    """Greedy requests whose logits every step processes (penalties, logit_bias, min_tokens) and
    that ask for log-probs; a stop id the model would emit early (its plain greedy token 1)."""
    early = int(inference.generate(params, [prompts[2]], cfg, max_new_tokens=3).tokens[0, 1])
    return [
        SamplingParams(
            max_tokens=8, temperature=0.0, presence_penalty=1.5, frequency_penalty=0.5, logprobs=3
        ),
        SamplingParams(
            max_tokens=9, temperature=0.0, repetition_penalty=1.8, logit_bias=((7, 4.0), (3, -2.0))
        ),
        SamplingParams(
            max_tokens=6, temperature=0.0, min_tokens=4, stop_token_ids=(early,), logprobs=2
        ),
    ]


def _serve_all(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]):
    got = [Collect() for _ in prompts]
    for prompt, p, c in zip(prompts, params, got, strict=True):
        engine.submit(prompt, p, c)
    _run(engine)
    return got


@pytest.mark.slow
def test_speculative_engine_processes_logits_and_reports_logprobs_as_plain_decode():
    """Under speculation every verified position's logits get the penalties, logit_bias and
    min_tokens of plain decode's step there, and log-probs are the verifier's: the speculative
    engine's greedy tokens and log-probs equal the plain engine's."""
    cfg, params = arm_model("orthros")
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (11, 5, 8)]
    reqs = _processed_requests(cfg, params, prompts)
    plain = _serve_all(Engine(params, cfg, **ENGINE_SHAPE, decode_steps=2), prompts, reqs)
    spec = Engine(params, cfg, **ENGINE_SHAPE, decode_steps=2, speculative=Speculative(3, 4))
    got = _serve_all(spec, prompts, reqs)
    for k, (want, have) in enumerate(zip(plain, got, strict=True)):
        assert have.tokens == want.tokens, k
        pairs = [(w, h) for w, h in zip(want.events, have.events, strict=True) if w.kind == "token"]
        for w, h in pairs:
            assert (h.logprob is None) == (reqs[k].logprobs is None), k
            if w.logprob is not None:
                np.testing.assert_allclose(h.logprob, w.logprob, atol=1e-5, rtol=0)
                assert [i for i, _ in h.top] == [i for i, _ in w.top], k
                np.testing.assert_allclose(
                    [x for _, x in h.top], [x for _, x in w.top], atol=1e-5, rtol=0
                )
    # The processing acted: the biased id is emitted, the early stop id waited for min_tokens.
    assert 7 in got[1].tokens
    assert reqs[2].stop_token_ids[0] not in got[2].tokens[:4]
    assert spec.metrics.spec_rounds > 0


@pytest.mark.parametrize(
    "arch,spec,kw,match",
    [
        ("orthros", Speculative(2, 41), {}, "draft_window=41 exceeds"),
        ("hybrid", Speculative(2, 4), {}, "recurrent state"),
        ("orthros", Speculative(2, 4), dict(prefix_caching=True), "prefix_caching"),
    ],
)
def test_speculative_engine_bad_settings_raise_before_any_compile(arch, spec, kw, match):
    cfg, params = arm_model(arch)
    compiled = device.compile_count()
    with pytest.raises(ValueError, match=match):
        Engine(params, cfg, **ENGINE_SHAPE, speculative=spec, **kw)
    assert device.compile_count() == compiled


@pytest.mark.slow
def test_speculative_server_streams_token_by_token_reports_logprobs_and_metrics():
    cfg, params = arm_model("orthros")
    spec = dict(decode_steps=2, speculative=Speculative(3, 4), prefix_caching=False)
    prompt, n = [5, 17, 3, 9, 30, 2, 11], 9
    want = inference.generate(params, [prompt], cfg, max_new_tokens=n).tokens[0].tolist()
    with (
        _server(cfg, params, **spec) as server,
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
        body = {"model": NAME, "prompt": "ab", "max_tokens": 3, "logprobs": 2}
        r = http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        lps = r.json()["choices"][0]["logprobs"]
        # Byte tokens that are not valid UTF-8 alone share the key "\ufffd": 1 or 2 entries.
        assert len(lps["token_logprobs"]) == 3 and max(lps["token_logprobs"]) <= 0, lps
        assert all(1 <= len(t) <= 2 for t in lps["top_logprobs"]), lps
        body = {"model": NAME, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            chunks = [line for line in r.iter_lines() if line.startswith("data: {")]
        texts = [json.loads(c[6:])["choices"][0]["text"] for c in chunks]
        # The engine emits one event per token (the engine test's Collect); the stream's chunks
        # carry the text as it becomes valid UTF-8.
        assert "".join(texts) == TOK.decode(want), texts
        page = http.get("/metrics").text
    metrics = dict(line.rsplit(" ", 1) for line in page.splitlines() if not line.startswith("#"))
    assert int(metrics["orthros_spec_rounds_total"]) > 0
    assert 0 <= float(metrics["orthros_spec_acceptance_rate"]) <= 1
    assert 1 <= float(metrics["orthros_spec_tokens_per_verify"]) <= 4
