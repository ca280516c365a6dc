"""benchmarks/serve_load.py end to end at a tiny bench model: Table 4 through the server for one
pair, the TTFT comparison with the prefill benchmark, and the concurrency sweep (the engine
itself, through HTTP, and generate), with no compile while serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = """
import os
from orthros_jax.config.cli import load_config_file

def get_config():
    c = load_config_file(os.path.join({root!r}, "configs", "bench.py"))
    c.model.update(dict(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, window=8,
                        prefill_chunk=16, attention_block_local=8, attention_block_q=16,
                        attention_block_k=16))
    c.gdn.update(dict(num_k_heads=2, num_v_heads=4, k_head_dim=8, v_head_dim=8, chunk=8))
    c.table4_n_layers = 4  # one (gdn, gdn, gdn, attention) cycle for the hybrid arms
    return c
"""


def _run(tmp_path, *flags: str) -> tuple[dict, str]:
    """benchmarks/serve_load.py at the tiny bench model with `flags`; its json and markdown."""
    config = tmp_path / "tiny_bench.py"
    config.write_text(TINY.format(root=ROOT))
    out = tmp_path / "out"
    cmd = [sys.executable, "benchmarks/serve_load.py", f"--config={config}", f"--out={out}"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(
        [*cmd, *flags, "--repeats=1"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return json.loads((out / "serve_load.json").read_text()), (out / "serve_load.md").read_text()


# The two parts run as two items (each its own process, in parallel under xdist).
@pytest.mark.slow
def test_serve_load_table4_tiny(tmp_path):
    """Table 4 through the server for one pair, and the TTFT comparison with the prefill
    benchmark's call."""
    res, md = _run(tmp_path, "--shapes=40/4", "--pairs=transformer:orthros", "--concurrency=")
    row = res["table4"]["rows"]["40/4"]
    for arm in ("transformer", "orthros"):
        assert row[arm]["tokens"] == 2 * 4 and row[arm]["ttft_s"] > 0  # both requests, 4 each
    (ttft,) = res["table4"]["ttft"]
    assert ttft["T"] == 40 and ttft["transformer_over_orthros"]["prefill_speedup"] > 0
    assert res["table4"]["compiles_while_serving"] == 0 and res["concurrency"] == []
    assert "Table 4 through the server" in md and "against concurrency" not in md


@pytest.mark.slow
def test_serve_load_concurrency_tiny(tmp_path):
    """The concurrency sweep: the engine itself, through HTTP, and generate, with no compile
    while serving."""
    flags = ("--shapes=", "--concurrency=2", "--conc_min_len=8", "--conc_max_len=16")
    res, md = _run(tmp_path, *flags, "--conc_new=4")
    assert res["table4"] is None
    (conc,) = res["concurrency"]
    assert conc["clients"] == 2 and conc["generate"]["tokens"] == 2 * 4
    assert conc["engine"]["output_tok_s"] > 0 and conc["server"]["tokens"] == 2 * 4
    assert conc["compiles_while_serving"] == 0
    assert "| 2 |" in md and "Table 4" not in md
    assert (tmp_path / "out" / "serve_load.png").stat().st_size > 1000
