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


@pytest.mark.slow
def test_serve_load_tiny(tmp_path):
    config = tmp_path / "tiny_bench.py"
    config.write_text(TINY.format(root=ROOT))
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "benchmarks/serve_load.py",
        f"--config={config}",
        f"--out={out}",
        "--shapes=40/4",
        "--pairs=transformer:orthros",
        "--concurrency=2",
        "--conc_min_len=8",
        "--conc_max_len=16",
        "--conc_new=4",
        "--repeats=1",
    ]
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    res = json.loads((out / "serve_load.json").read_text())
    row = res["table4"]["rows"]["40/4"]
    for arm in ("transformer", "orthros"):
        assert row[arm]["tokens"] == 2 * 4 and row[arm]["ttft_s"] > 0  # both requests, 4 each
    (ttft,) = res["table4"]["ttft"]
    assert ttft["T"] == 40 and ttft["transformer_over_orthros"]["prefill_speedup"] > 0
    (conc,) = res["concurrency"]
    assert conc["clients"] == 2 and conc["generate"]["tokens"] == 2 * 4
    assert conc["engine"]["output_tok_s"] > 0 and conc["server"]["tokens"] == 2 * 4
    assert res["table4"]["compiles_while_serving"] == 0 and conc["compiles_while_serving"] == 0
    assert "| 2 |" in (out / "serve_load.md").read_text()
    assert (out / "serve_load.png").stat().st_size > 1000
