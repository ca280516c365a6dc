"""How a benchmark run was made, for its results file: the command line as typed (relative to
the repository, so that it can be run again as it stands) and the wall time."""

from __future__ import annotations

import os
import shlex
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command_line() -> str:
    """ "python benchmarks/x.py --flag=..." as this process was started."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return "python " + shlex.join([script, *sys.argv[1:]])


def run_record(t0: float) -> dict[str, Any]:
    """{"command": command_line(), "wall_s": seconds since t0} (t0 from time.perf_counter() at
    the run's start)."""
    return {"command": command_line(), "wall_s": round(time.perf_counter() - t0, 1)}
