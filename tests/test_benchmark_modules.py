"""Every benchmark script can be imported beside every other one in one process (tests import
their functions into shared pytest workers): no module defines absl flags at import, where two
scripts' `--out` would collide."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_all_benchmark_modules_import_together():
    names = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")
    assert {"kv_capacity", "moe_routing", "serve_load"} <= set(names)
    # As when run (python benchmarks/x.py), the scripts' own folder is on the path too.
    code = "import sys; sys.path.insert(0, 'benchmarks')\n"
    code += "".join(f"import benchmarks.{n}\n" for n in names)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_run_record_names_the_command_as_typed(monkeypatch):
    from benchmarks import run_record

    script = str(ROOT / "benchmarks" / "kv_capacity.py")
    monkeypatch.setattr(sys, "argv", [script, "--out=runs/x", "--concurrency=4,8", "--a=b c"])
    got = run_record.run_record(t0=0.0)
    want = "python benchmarks/kv_capacity.py --out=runs/x --concurrency=4,8 '--a=b c'"
    assert got["command"] == want and got["wall_s"] > 0
