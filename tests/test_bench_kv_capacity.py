"""benchmarks/kv_capacity.py's sweep at a tiny model: both engines at one cache budget (int8 +
prefix caching holds more slots), two clients through HTTP, one round, the JSON and Markdown
written with every field."""

from __future__ import annotations

import json

import jax
import pytest
from helpers import tiny_config

from orthros_jax.model import init_params


@pytest.mark.slow  # ~50 s on 2 loaded cores: the two engines compile
def test_kv_capacity_tiny(tmp_path):
    from benchmarks import common, kv_capacity

    cfg = tiny_config()
    params = init_params(cfg, jax.random.PRNGKey(0))
    full = common.cache_bytes_per_token(cfg)
    result = kv_capacity.capacity(
        cfg,
        params,
        memory_bytes=4 * full * 64,  # 4 full-precision slots of 64 tokens
        max_len=64,
        counts=[2],
        system=24,
        question=4,
        new=4,
        repeats=1,
        command="python benchmarks/kv_capacity.py --out=x",
        chunk_budget=32,
        prefill_lengths=(32,),  # one prefill bucket: the warm-ups compile little
        batches=("1",),
        decode_steps=2,
        batch_wait_s=0.05,
    )
    kv_capacity.CLIENT.close()
    kv_capacity.write(result, str(tmp_path))
    res = json.loads((tmp_path / "kv_capacity.json").read_text())
    full_arm, int8_arm = res["arms"]["full"], res["arms"]["int8_prefix"]
    assert full_arm["slots"] == 4 and int8_arm["slots"] > full_arm["slots"]
    assert int8_arm["bytes_per_token"] < full_arm["bytes_per_token"] == full
    for arm in (full_arm, int8_arm):
        assert arm["cache_bytes"] <= 4 * full * 64 and arm["warmup_s"] > 0
    (row,) = res["sweep"]
    assert row["clients"] == 2
    for name in ("full", "int8_prefix"):
        assert row[name]["tokens"] == 2 * 4
        assert row[name]["output_tok_s"] > 0 and row[name]["ttft_s"] > 0
    assert row["tok_s_ratio"] > 0 and row["ttft_ratio"] > 0
    assert res["prefix"]["hits"] > 0 and res["prefix"]["reused"] >= 24
    assert res["compiles_while_serving"] == 0
    assert res["wall_s"] > 0 and len(res["load_before"]) == 3 and res["date"]
    md = (tmp_path / "kv_capacity.md").read_text()
    assert "| 2 |" in md and "python benchmarks/kv_capacity.py --out=x" in md
