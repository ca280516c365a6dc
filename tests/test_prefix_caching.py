"""Prefix caching (serving/prefix.py) through the server, for every arm: greedy text with it
equals `generate` (no prefix caching) on a workload of shared, colliding and whole-turn prefixes
sent concurrently to fewer rows than requests (rows evicted while others run); /metrics counts
the reuse; the lookup's rules (any prefix for attention, the whole row for recurrent kinds; LRU
among free rows; in place when the matched row is free)."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import openai
import pytest
from serving_helpers import arm_model

from orthros_jax import inference
from orthros_jax.data.tokenizers import ByteTokenizer
from orthros_jax.serving.api import create_app
from orthros_jax.serving.background import BackgroundServer
from orthros_jax.serving.engine import Engine
from orthros_jax.serving.prefix import Match, PrefixIndex

TOK = ByteTokenizer()
NEW = 5


def _workload(cfg, params) -> list[list[int]]:
    """Turn 1, turn 2 = turn 1 + its greedy answer + more (the whole previous row), a shared
    system prefix with different questions, and prompts colliding on 10 then 19 tokens."""
    rng = np.random.default_rng(7)
    system = rng.integers(0, 256, 14).tolist()
    turn1 = system + [7, 8]
    answer = inference.generate(params, [turn1], cfg, max_new_tokens=NEW).tokens[0].tolist()
    turn2 = turn1 + answer[: NEW - 1] + [9, 10, 11]  # the row holds turn1 + all but the last
    collide = system[:10] + rng.integers(0, 256, 9).tolist()
    # Phases sent one after the other, the requests of a phase together.
    return [
        [turn1],
        [turn2, system + [1, 2, 3]],
        [system + [4], collide, collide + [5, 6], system[:10] + [0]],
        [turn2 + [12]],
    ]


@pytest.mark.slow
# The two lookup rules: any prefix (attention, two streams) and the whole row (a recurrent
# kind beside attention). That the engine equals `generate` for every kind is
# test_kind_conformance's engine case.
@pytest.mark.parametrize("arch", ["orthros", "hybrid"])
def test_greedy_with_prefix_caching_equals_generate_through_the_server(arch):
    cfg, params = arm_model(arch)
    phases = _workload(cfg, params)
    prompts = [p for phase in phases for p in phase]
    # One ragged batch: one prefill compile, not one per prompt length (the rows are
    # independent, and the server batches its rows as well).
    out = inference.generate(params, prompts, cfg, max_new_tokens=NEW)
    want = [out.tokens[k, : out.lengths[k]].tolist() for k in range(len(prompts))]
    engine = Engine(
        params,
        cfg,
        max_batch=3,
        max_len=48,
        chunk_budget=8,
        prefill_batches=(1, 3),
        decode_text=TOK.decode,
        prefix_caching=True,
    )
    with BackgroundServer(create_app(engine, TOK, "m")) as server:
        client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="-", max_retries=0, timeout=120
        )

        async def one(prompt):
            r = await client.completions.create(
                model="m", prompt=prompt, max_tokens=NEW, temperature=0
            )
            return r.choices[0].text

        async def main():  # 4 requests on 3 rows in the third phase: evictions while running
            return [t for phase in phases for t in await asyncio.gather(*map(one, phase))]

        got = asyncio.run(main())
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
    for k, text in enumerate(got):
        assert text == TOK.decode(want[k]), (arch, k)
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if not line.startswith("#"))
    assert int(values["orthros_prefix_cache_queries_total"]) == len(prompts)
    assert int(values["orthros_prefix_cache_reused_tokens_total"]) > 0, arch  # some reuse


@pytest.mark.slow
def test_lookup_rules():
    attn, _ = arm_model("orthros")
    idx = PrefixIndex(attn, 3)
    idx.append(0, [1, 2, 3, 4, 5])
    idx.append(1, [1, 2, 9])
    idx.append(2, [7])
    # The longest prefix (row 0, 3 tokens), in place when that row is free.
    assert idx.lookup([1, 2, 3, 8], free=[0, 2]) == Match(0, 0, 3)
    # Held by a running row (0 not free): copied into the least recently used free row (2).
    assert idx.lookup([1, 2, 3, 8], free=[1, 2]) == Match(0, 1, 3)
    # The last prompt token is always prefilled.
    assert idx.lookup([1, 2, 3], free=[2]).length == 2
    assert idx.lookup([6, 6], free=[1, 2]) == Match(1, 1, 0)  # no match: the LRU free row
    idx.take(Match(0, 2, 3))
    assert idx.ids[2] == [1, 2, 3] and idx.ids[0] == [1, 2, 3, 4, 5]
    rec, _ = arm_model("hybrid")  # a gdn layer: only a row's whole length has its state
    idx = PrefixIndex(rec, 2)
    idx.append(0, [1, 2, 3, 4])
    assert idx.lookup([1, 2, 3, 9], free=[1]).length == 0
    assert idx.lookup([1, 2, 3, 4, 9], free=[1]) == Match(0, 1, 4)


@pytest.mark.slow
def test_engine_without_prefix_caching_records_nothing():
    cfg, params = arm_model("transformer")
    engine = Engine(params, cfg, max_batch=2, max_len=40, chunk_budget=8)
    assert engine.prefix is None
