"""benchmarks/moe_routing.py's measurement on a tiny MoE Orthros: paired copies add no experts
to what a decode step reads, independent ones may; every figure is positive."""

from __future__ import annotations

import os

import jax
import pytest

from benchmarks import moe_routing
from orthros_jax.config.cli import load_config_file
from orthros_jax.config.moe import ROUTINGS
from orthros_jax.model import init_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_paired_copies_read_no_more_experts_than_independent_ones():
    model = load_config_file(os.path.join(ROOT, "configs", "bench.py")).model
    moe = dict(n_experts=8, top_k=2, d_expert=8)
    cfgs = moe_routing.moe_configs(model, 32, 1, 4, moe)
    cfgs = {n: c.replace(vocab_size=64, d_ff=32) for n, c in cfgs.items()}
    params = init_params(cfgs["paired"], jax.random.PRNGKey(0))
    result = moe_routing.measure(cfgs, params, [2], 12, 2, 16, 8, 1)
    (row,) = result["decode"]
    paired, independent = row["paired"], row["independent"]
    assert paired["experts"] == paired["base_experts"]  # the copies take their tokens' experts
    assert paired["experts"] <= independent["experts"]
    for r in (paired, independent):
        assert r["expert_bytes_per_step"] > 0 and r["compiled_bytes"] > 0 and r["step_s"] > 0
    assert row["time_ratio"] > 0 and result["train"]["time_ratio"] > 0
    assert "| 2 | paired |" in moe_routing.markdown(
        result
        | dict(
            settings=dict(
                d_model=32,
                layers=1,
                experts=8,
                top_k=2,
                d_expert=8,
                window=4,
                steps=2,
                prompt=12,
                context=16,
                repeats=1,
            ),
            backend="cpu",
            load=[0.0],
            date="today",
        )
    )


@pytest.mark.slow
def test_expert_parallel_collectives_on_8_devices(tmp_path):
    """benchmarks/moe_expert_parallel.py on a tiny MoE: with the experts split the PT step
    gathers tokens and reduce-scatters outputs, and all-reduces fewer gradient bytes than
    data parallelism with every expert on every device (expert gradients stay local)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "moe_expert_parallel.py"),
            f"--out={tmp_path}",
            "--d_model=32",
            "--layers=1",
            "--experts=8",
            "--d_expert=8",
            "--train_len=16",
            "--context=16",
            "--meshes=expert=8,data=8",  # the two the assertions compare (of three)
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "moe_expert_parallel.json").read_text())
    rows = {(r["mesh"], r["routing"]): r for r in result["rows"]}
    assert sorted(rows) == sorted((m, r) for m in ("data=8", "expert=8") for r in ROUTINGS)
    for routing in ("paired", "independent"):
        ep, dp = rows[("expert=8", routing)]["train"], rows[("data=8", routing)]["train"]
        assert ep["all-gather"] > dp.get("all-gather", 0) and ep["reduce-scatter"] > 0
        assert ep["all-reduce"] < dp["all-reduce"]
    assert "| expert=8 | paired |" in (tmp_path / "moe_expert_parallel.md").read_text()
