"""The OpenAI-compatible server with the official `openai` client, on 127.0.0.1 (a free port):
greedy equals `generate` for every arm under concurrent, staggered requests; streaming gives
the same text; seeded sampling repeats; a disconnect frees its slot; every bad input gets its
status; /health still answers after 200 mixed requests; SIGTERM drains (launch/serve.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from helpers import free_port
from serving_helpers import ENGINE_SHAPE, NEW_TOKENS, PROMPT_LENS, arm_model

from orthros_jax import checkpoint, inference
from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.serving.api import create_app
from orthros_jax.serving.background import BackgroundServer
from orthros_jax.serving.chat import ChatTemplate
from orthros_jax.serving.engine import Engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "tiny"
TOK = ByteTokenizer()
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"


def _server(cfg, params, template=None, **kw) -> BackgroundServer:
    kw = ENGINE_SHAPE | {"prefill_batches": None} | kw  # the engine tests' shape: shared compiles
    kw["prefill_batches"] = kw["prefill_batches"] or tuple(sorted({1, kw["max_batch"]}))
    engine = Engine(params, cfg, decode_text=TOK.decode, eos_id=None, **kw)
    return BackgroundServer(create_app(engine, TOK, NAME, template))


def _client(server, cls=openai.OpenAI):
    return cls(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def orthros_server():
    cfg, params = arm_model("orthros")
    with _server(cfg, params, ChatTemplate(TEMPLATE)) as server:
        yield server, cfg, params


@pytest.mark.slow
def test_greedy_completions_match_generate_under_concurrent_staggered_requests(orthros_server):
    """The HTTP path under concurrent, staggered requests, on one arm: that the engine equals
    `generate` for every layer kind is test_kind_conformance's engine case."""
    server, cfg, params = orthros_server
    rng = np.random.default_rng(3)
    lens, news = PROMPT_LENS, NEW_TOKENS
    prompts = [rng.integers(0, 256, n).tolist() for n in lens]
    want = inference.generate(params, prompts, cfg, max_new_tokens=max(news)).tokens

    async def one(client, k):
        await asyncio.sleep(0.05 * k)  # they arrive while the earlier ones run
        r = await client.completions.create(
            model=NAME, prompt=prompts[k], max_tokens=news[k], temperature=0, logprobs=0
        )
        return r.choices[0]

    client = _client(server, openai.AsyncOpenAI)

    async def main():
        return await asyncio.gather(*(one(client, k) for k in range(len(prompts))))

    got = asyncio.run(main())
    for k, choice in enumerate(got):
        assert choice.text == TOK.decode(want[k, : news[k]].tolist()), k
        assert len(choice.logprobs.token_logprobs) == news[k] and choice.finish_reason == "length"


@pytest.mark.slow
def test_stream_matches_whole_text_and_seeded_sampling_repeats(orthros_server):
    server, cfg, params = orthros_server
    client = _client(server)
    kw = dict(model=NAME, prompt="The cat sat", max_tokens=12, temperature=0.9, top_k=40, seed=5)
    # top_k is not an OpenAI field: it goes in extra_body, as with vLLM.
    top_k = {"top_k": kw.pop("top_k")}
    whole = client.completions.create(**kw, extra_body=top_k)
    again = client.completions.create(**kw, extra_body=top_k)
    assert whole.choices[0].text == again.choices[0].text
    chunks = list(client.completions.create(**kw, extra_body=top_k, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    other = client.completions.create(**(kw | {"seed": 6}), extra_body=top_k)
    assert other.choices[0].text != whole.choices[0].text
    # Chat: the template's prompt through the completions endpoint gives the same text.
    msgs = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=6, temperature=0)
    plain = client.completions.create(
        model=NAME, prompt="<user>hi\n<assistant>", max_tokens=6, temperature=0
    )
    assert chat.choices[0].message.content == plain.choices[0].text
    streamed = client.chat.completions.create(
        model=NAME, messages=msgs, max_tokens=6, temperature=0, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        == plain.choices[0].text
    )
    assert [m.id for m in client.models.list().data] == [NAME]


@pytest.mark.slow
def test_a_disconnect_frees_the_slot(orthros_server):
    _, cfg, params = orthros_server
    with _server(cfg, params, max_batch=1) as server:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            body = {
                "model": NAME,
                "prompt": "x",
                "max_tokens": 40,
                "temperature": 0,
                "stream": True,
            }
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
            # The only slot is free again: the next request is admitted and completes.
            t = time.perf_counter()
            r = http.post("/v1/completions", json=body | {"stream": False, "max_tokens": 3})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
            assert time.perf_counter() - t < 30
            metrics = http.get("/metrics").text
            assert 'orthros_requests_total{outcome="cancelled"} 1' in metrics


BAD = [
    ({"prompt": "a", "temperature": -1}, 400, "temperature"),
    ({"prompt": "a", "top_p": 0}, 400, "top_p"),
    ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "a", "max_tokens": "many"}, 400, "max_tokens"),
    ({"prompt": "a", "seed": -3}, 400, "seed"),
    ({"prompt": "a", "stop": [1]}, 400, "stop"),
    ({"prompt": "a", "logprobs": 9}, 400, "logprobs"),
    ({"prompt": "a", "model": "gpt-4"}, 400, "model"),
    ({"prompt": "x" * 41}, 400, "prompt"),  # the cache holds 40
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": "\ud800"}, 400, "prompt"),
    ({"prompt": [3, 256]}, 400, "prompt"),
    ({"prompt": [[1, 2], "a", 3]}, 400, "prompt"),
    ({}, 400, "prompt"),
]


def _post(http, body):
    """POST /v1/completions with ASCII JSON (a lone surrogate stays an escape, as a client
    sends)."""
    headers = {"Content-Type": "application/json"}
    return http.post("/v1/completions", content=json.dumps(body), headers=headers)


@pytest.mark.slow
def test_bad_inputs_get_their_status_and_health_survives_200_mixed_requests(orthros_server):
    server, cfg, params = orthros_server
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for body, status, param in BAD:
            r = _post(http, {"model": NAME} | body)
            assert r.status_code == status, (body, r.text)
            err = r.json()["error"]
            assert err["param"] == param and err["type"] == "invalid_request_error", (body, err)
        raw = b'{"model": "tiny", "prompt": "\xff\xfe"}'  # not UTF-8
        r = http.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"]
        assert http.post("/v1/completions", content=b"{nope").status_code == 400
    with _server(cfg, params) as plain, httpx.Client(base_url=plain.url, timeout=60) as http:
        r = http.post(
            "/v1/chat/completions",
            json={"model": NAME, "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
    client = _client(server)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=NAME, prompt="a", top_p=2.0)

    async def mixed():
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:

            async def one(i):
                body = {"model": NAME} | (
                    BAD[i % len(BAD)][0] if i % 3 else {"prompt": f"n{i}", "max_tokens": 2}
                )
                async with sem:
                    return (await _post(http, body)).status_code

            return await asyncio.gather(*(one(i) for i in range(200)))

    codes = asyncio.run(mixed())
    assert codes.count(200) == 67 and codes.count(400) == 133
    health = httpx.get(server.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    metrics = dict(
        line.rsplit(" ", 1)
        for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines()
        if not line.startswith("#")
    )
    assert metrics["orthros_queue_depth"] == "0" and metrics["orthros_active_slots"] == "0"
    # 67 good requests here, each with a first token (earlier tests of this server add more).
    assert int(metrics["orthros_time_to_first_token_seconds_count"]) >= 67
    assert (
        metrics['orthros_time_to_first_token_seconds_bucket{le="+Inf"}']
        == metrics["orthros_time_to_first_token_seconds_count"]
    )


@pytest.mark.slow
def test_full_queue_is_429(orthros_server):
    _, cfg, params = orthros_server
    engine = Engine(
        params, cfg, max_batch=1, max_len=40, chunk_budget=8, max_queue=1, decode_text=TOK.decode
    )
    gate, step = threading.Event(), engine.step
    engine.step = lambda: (gate.wait(60), step())  # the engine holds still until the gate opens
    with BackgroundServer(create_app(engine, TOK, NAME)) as server:

        async def burst():
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
                body = {"model": NAME, "prompt": "q", "max_tokens": 3, "temperature": 0}
                first = asyncio.create_task(http.post("/v1/completions", json=body))
                while engine.metrics.queue_depth < 1:
                    await asyncio.sleep(0.01)
                second = await http.post("/v1/completions", json=body)  # the queue is full
                gate.set()
                return second, await first

        second, first = asyncio.run(burst())
    assert second.status_code == 429 and second.json()["error"]["type"] == "rate_limit_error"
    assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] == 3


@pytest.mark.slow
def test_serve_cli_drains_on_sigterm(orthros_server, tmp_path):
    """The CLI serving with speculation (--speculative_k, the draft window defaulting to the
    model's window, within --max_len): a stream cut by SIGTERM still finishes, then it exits 0."""
    _, cfg, params = orthros_server
    checkpoint.save_model(str(tmp_path / "m"), cfg, params)
    port = free_port()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "serve.py"),
            f"--model={tmp_path / 'm'}",
            f"--port={port}",
            "--max_batch=2",
            "--max_len=64",
            "--prefill_lengths=8",
            "--speculative_k=2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.3)
        body = {"model": "m", "prompt": "drain", "max_tokens": 40, "temperature": 0, "stream": True}
        got = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not got:
                    proc.send_signal(signal.SIGTERM)  # mid-stream: the stream still finishes
                if line.startswith("data:"):
                    got.append(line[5:].strip())
        assert got[-1] == "[DONE]"
        assert json.loads(got[-2])["choices"][0]["finish_reason"] == "length"
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
