"""The OpenAI protocol as typed models (serving/protocol.py), through the server with the
official `openai` client and httpx: /openapi.json documents every field; each implemented field
has its observable effect (penalties against a float64 oracle over the PT forward, logit_bias,
min_tokens, echo, n > 1 with per-choice seeds); unknown and unsupported fields are 400s naming
them; a fuzz of malformed bodies never gets a 5xx."""

from __future__ import annotations

import functools
import json

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest
from serving_helpers import arm_model

from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.inference import logit_processing as lp
from orthros_jax.model import OrthrosLM
from orthros_jax.serving.api import create_app
from orthros_jax.serving.background import BackgroundServer
from orthros_jax.serving.chat import ChatTemplate
from orthros_jax.serving.engine import Engine
from orthros_jax.serving.protocol import ChatCompletionRequest, CompletionRequest

NAME = "tiny"
TOK = ByteTokenizer()
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def served():
    cfg, params = arm_model("orthros")
    engine = Engine(
        params,
        cfg,
        max_batch=3,
        max_len=40,
        chunk_budget=8,
        prefill_batches=(1, 3),
        decode_text=TOK.decode,
        eos_id=None,
    )
    with BackgroundServer(create_app(engine, TOK, NAME, ChatTemplate(TEMPLATE))) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=120)
        with httpx.Client(base_url=server.url, timeout=120) as http:
            yield client, http, cfg, params


ORACLE_LEN = 24


@functools.partial(jax.jit, static_argnums=2)
def _forward(params, tokens, cfg):
    return OrthrosLM(cfg).apply({"params": params}, tokens)


def _greedy_oracle(cfg, params, prompt, n, presence=0.0, frequency=0.0, repetition=1.0):
    """Greedy tokens under the penalties, from the PT forward's logits in float64."""
    ids, out = list(prompt), []
    for _ in range(n):
        padded = np.zeros((1, ORACLE_LEN), np.int32)  # causal: the padding changes nothing before
        padded[0, : len(ids)] = ids
        x = np.asarray(_forward(params, jnp.asarray(padded), cfg)[0, len(ids) - 1], np.float64)
        counts = np.bincount(out, minlength=x.shape[0])
        seen = (counts > 0) | (np.bincount(prompt, minlength=x.shape[0]) > 0)
        x = np.where(seen, np.where(x > 0, x / repetition, x * repetition), x)
        x = x - frequency * counts - presence * (counts > 0)
        out.append(int(np.argmax(x)))
        ids.append(out[-1])
    return out


@pytest.mark.slow
def test_openapi_documents_every_request_field(served):
    _, http, _, _ = served
    schema = http.get("/openapi.json").json()
    paths = schema["paths"]
    for path, model in (
        ("/v1/completions", CompletionRequest),
        ("/v1/chat/completions", ChatCompletionRequest),
    ):
        ref = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        doc = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert set(doc["properties"]) == set(model.model_fields), path
        assert doc["additionalProperties"] is False
        assert "400" in paths[path]["post"]["responses"]
    assert http.get("/docs").status_code == 200


@pytest.mark.slow
def test_penalties_match_a_float64_oracle(served):
    client, _, cfg, params = served
    prompt = [5, 9, 5, 200, 31]
    for kw in (
        dict(frequency_penalty=1.5),
        dict(presence_penalty=2.0),
        dict(repetition_penalty=4.0),
        dict(frequency_penalty=0.7, presence_penalty=-0.5),
    ):
        want = _greedy_oracle(
            cfg,
            params,
            prompt,
            8,
            kw.get("presence_penalty", 0.0),
            kw.get("frequency_penalty", 0.0),
            kw.get("repetition_penalty", 1.0),
        )
        extra = (
            {"repetition_penalty": kw.pop("repetition_penalty")}
            if "repetition_penalty" in kw
            else None
        )
        r = client.completions.create(
            model=NAME, prompt=prompt, max_tokens=8, temperature=0, extra_body=extra, **kw
        )
        assert r.choices[0].text == TOK.decode(want), kw
    plain = _greedy_oracle(cfg, params, prompt, 8)
    assert plain != _greedy_oracle(cfg, params, prompt, 8, frequency=1.5)  # the test can fail


@pytest.mark.slow
def test_logit_bias_min_tokens_echo_and_n(served):
    client, _, cfg, params = served
    r = client.completions.create(
        model=NAME, prompt="ab", max_tokens=5, temperature=0.8, seed=1, logit_bias={"65": 100}
    )
    assert r.choices[0].text == "AAAAA"
    banned = _greedy_oracle(cfg, params, list(b"ab"), 1)[0]
    r = client.completions.create(
        model=NAME, prompt="ab", max_tokens=3, temperature=0, logit_bias={str(banned): -100}
    )
    assert TOK.encode(r.choices[0].text)[0] != banned
    # min_tokens: the first greedy token is a stop id, which ends the text at once (not shown).
    first = _greedy_oracle(cfg, params, list(b"xy"), 1)[0]
    stop = {"stop_token_ids": [first]}
    r = client.completions.create(
        model=NAME, prompt="xy", max_tokens=6, temperature=0, extra_body=stop
    )
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == ""
    r = client.completions.create(
        model=NAME, prompt="xy", max_tokens=6, temperature=0, extra_body=stop | {"min_tokens": 4}
    )
    assert r.usage.completion_tokens >= 4 and first not in TOK.encode(r.choices[0].text)[:4]
    # echo: the prompt, then what the same request gives without it.
    plain = client.completions.create(model=NAME, prompt="echo", max_tokens=4, temperature=0)
    r = client.completions.create(model=NAME, prompt="echo", max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text == "echo" + plain.choices[0].text
    chunks = list(
        client.completions.create(
            model=NAME, prompt="echo", max_tokens=4, temperature=0, echo=True, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    # n > 1: choice i samples with seed + i, as its own request would.
    kw = dict(model=NAME, prompt="n", max_tokens=8, temperature=1.0)
    many = client.completions.create(**kw, n=3, seed=10)
    texts = [c.text for c in sorted(many.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 3
    for i, text in enumerate(texts):
        assert client.completions.create(**kw, seed=10 + i).choices[0].text == text
    chat = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "q"}],
        max_tokens=4,
        n=2,
        seed=3,
        temperature=1.0,
    )
    assert len(chat.choices) == 2 and chat.usage.completion_tokens == 8


REFUSED = [
    ("/v1/completions", {"bogus": 1}, "bogus"),
    ("/v1/completions", {"suffix": "x"}, "suffix"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"echo": True, "logprobs": 1}, "echo"),
    ("/v1/completions", {"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
    ("/v1/completions", {"logit_bias": {"999": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"3": 101}}, "logit_bias"),
    ("/v1/completions", {"frequency_penalty": 3}, "frequency_penalty"),
    ("/v1/completions", {"n": 0}, "n"),
    ("/v1/completions", {"stream_options": {"x": 1}}, "stream_options"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"frobnicate": True}, "frobnicate"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "z": 1}]}, "messages"),
]


@pytest.mark.slow
@pytest.mark.parametrize("path,extra,param", REFUSED)
def test_unknown_and_unsupported_fields_are_400s_naming_them(served, path, extra, param):
    _, http, _, _ = served
    base = {"model": NAME, "max_tokens": 2}
    base |= (
        {"prompt": "a"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "a"}]}
    )
    r = http.post(path, json=base | extra)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert param in err["message"] or param == "messages", err


def _fuzz_bodies(rng: np.random.Generator, n: int) -> list[bytes]:
    fields = list(CompletionRequest.model_fields)
    values = [
        None,
        True,
        -1,
        0,
        7,
        2.5,
        1e300,
        "",
        "x",
        "\ud800",
        [],
        [1, "a"],
        [[3]],
        {},
        {"a": [1]},
        [-5],
        2**70,
    ]
    out = [
        b"",
        b"{",
        b"[]",
        b"3",
        b'"s"',
        b"\xff\xfe",
        b'{"model": "tiny", "prompt": "a"',
        b'{"model": "tiny", "prompt": NaN}',
    ]
    for _ in range(n):
        body = {"model": NAME, "prompt": "a", "max_tokens": 2}
        for name in rng.choice(fields, size=int(rng.integers(1, 4)), replace=False):
            body[str(name)] = values[int(rng.integers(len(values)))]
        out.append(json.dumps(body).encode())
    return out


@pytest.mark.slow
def test_malformed_bodies_never_get_a_5xx(served):
    _, http, _, _ = served
    codes = []
    for raw in _fuzz_bodies(np.random.default_rng(0), 60):
        r = http.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
        codes.append(r.status_code)
        assert r.status_code < 500, (raw, r.text)
        if r.status_code != 200:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    assert codes.count(400) > 30  # most are bad (and some get through: the fuzz is not all 400)


def test_penalty_processing_matches_numpy_row_by_row():
    rng = np.random.default_rng(0)
    b, v = 3, 11
    logits = rng.normal(size=(b, v)).astype(np.float32)
    prompt = rng.integers(0, v, (b, 4)).astype(np.int32)
    hist = lp.record_prompt(
        lp.init_history(b, v), jnp.asarray(prompt), jnp.array([4, 2, 0]), jnp.ones(b, bool)
    )
    for toks in ([1, 2, 3], [1, 5, 3], [1, 2, 7]):
        hist = lp.record_output(hist, jnp.array(toks), jnp.array([True, True, False]))
    pen = lp.Penalties(
        presence=jnp.array([0.5, 0.0, 1.0]),
        frequency=jnp.array([0.25, 1.0, 0.0]),
        repetition=jnp.array([2.0, 1.0, 1.5]),
        min_tokens=jnp.array([0, 5, 0]),
        bias_ids=jnp.array([[4, -1], [0, 11], [2, 2]]),
        bias_values=jnp.array([[3.0, 9.0], [-1.0, 9.0], [1.0, 1.0]]),
        stops=jnp.array([[6, -1], [7, 8], [-1, -1]]),
    )
    got = np.asarray(lp.apply(jnp.asarray(logits), hist, pen, jnp.array([3, 3, 0])))
    for i in range(b):
        outs = [[1, 1, 1], [2, 5, 2], []][i]  # the fed tokens of rows 0 and 1
        counts = np.bincount(outs, minlength=v).astype(np.float64)
        seen = (counts > 0) | np.isin(np.arange(v), prompt[i, : [4, 2, 0][i]])
        r = float(pen.repetition[i])
        x = logits[i].astype(np.float64)
        x = np.where(seen, np.where(x > 0, x / r, x * r), x)
        x = x - float(pen.frequency[i]) * counts - float(pen.presence[i]) * (counts > 0)
        for t, val in zip(np.asarray(pen.bias_ids[i]), np.asarray(pen.bias_values[i]), strict=True):
            if 0 <= t < v:
                x[t] += val
        if i == 1:  # 3 tokens < min_tokens 5: its stop ids are out
            x[[7, 8]] = -np.inf
        np.testing.assert_allclose(got[i], x, rtol=1e-6, atol=1e-6)
    idle = pen.replace(
        presence=jnp.zeros(b),
        frequency=jnp.zeros(b),
        repetition=jnp.ones(b),
        min_tokens=jnp.zeros(b, jnp.int32),
        bias_values=jnp.zeros((b, 2)),
    )
    np.testing.assert_array_equal(
        np.asarray(lp.apply(jnp.asarray(logits), hist, idle, 0 * pen.min_tokens)), logits
    )


def test_positions_are_processed_as_successive_decode_steps():
    """apply_positions (a speculative round's L verified positions at once) equals L plain
    steps, each recording its fed token then processing its logits; record_outputs the same
    history as recording the kept tokens one by one."""
    rng = np.random.default_rng(1)
    b, length, v = 2, 4, 9
    logits = jnp.asarray(rng.normal(size=(b, length, v)).astype(np.float32))
    fed = jnp.asarray(rng.integers(0, v, (b, length)).astype(np.int32))
    hist = lp.record_output(lp.init_history(b, v), jnp.array([3, 3]), jnp.array([True, True]))
    pen = lp.Penalties(
        presence=jnp.array([0.7, 0.0]),
        frequency=jnp.array([0.3, 1.1]),
        repetition=jnp.array([1.0, 1.9]),
        min_tokens=jnp.array([3, 0]),
        bias_ids=jnp.array([[2], [5]]),
        bias_values=jnp.array([[1.5], [-0.5]]),
        stops=jnp.array([[4], [-1]]),
    )
    step = jnp.array([1, 6])
    got = np.asarray(lp.apply_positions(logits, hist, pen, fed, step))
    h = hist
    for j in range(length):
        h = lp.record_output(h, fed[:, j], jnp.ones(b, bool))
        want = np.asarray(lp.apply(logits[:, j], h, pen, step + j))
        np.testing.assert_allclose(got[:, j], want, rtol=0, atol=0)
    kept = jnp.arange(length)[None] <= jnp.array([[1], [3]])
    h2 = lp.record_outputs(hist, fed, kept)
    for i, n in enumerate((2, 4)):
        np.testing.assert_array_equal(
            np.asarray(h2.counts[i]),
            np.asarray(hist.counts[i]) + np.bincount(np.asarray(fed[i, :n]), minlength=v),
        )
