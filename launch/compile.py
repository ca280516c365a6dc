"""Compile a train, prefill or decode config for an accelerator that is not here, and say
whether it fits and how fast it can be at best (benchmarks/aot.py does the work).

    python launch/compile.py --config=configs/pt_1p3b.py --target=v5e:4x4 --out=runs/aot/pt
    python launch/compile.py --config=configs/prefill_8b.py --target=v5p:2x2x2 \
        --mesh.sequence=8 --config.inference.prompt_len=1048576 \
        --config.inference.max_len=1048576 --out=runs/aot/prefill_1m

--target: a TPU topology (v5e:2x2, v5e:4x4, v5p:2x2x1, v5p:2x2x2, v6e:2x2, ...; needs libtpu,
the `tpu` extra) or h100x1..h100x8 (needs jax-cuda12-plugin and jax-cuda12-pjrt of jax's
version, --no-deps). --mesh.<axis>=N is --config.mesh.<axis>=N. Writes --out/compile.json,
--out/compile.md (the table: per-device memory vs HBM, analytic FLOPs, collective bytes,
roofline step time and MFU bound) and --out/hlo.txt.gz (the optimized program). A bad target,
a mesh that does not match the target's device count or a missing compiler exits with one line.
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import sys

# The repository root: benchmarks/ lives beside the package (it is not installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Spell --mesh.X as the config override it is (before absl parses the flags).
sys.argv = [
    a.replace("--mesh.", "--config.mesh.", 1) if a.startswith("--mesh.") else a for a in sys.argv
]
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # several compiles may run at once
# Compiling for a target needs no local accelerator: the host runs on CPU (and a GPU plugin
# then skips its local CUDA checks).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

from orthros_jax.config import cli  # noqa: E402

_CONFIG = cli.define_config_flag("configs/pt_1p3b.py", "Train or inference config.", "compile.py")
_TARGET = flags.DEFINE_string("target", None, "v5e:4x4 | v5p:2x2x2 | v6e:2x2 | h100x8 | ...")
_OUT = flags.DEFINE_string("out", None, "Output folder (compile.json, compile.md).")
flags.mark_flags_as_required(["target", "out"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from benchmarks import aot, aot_table
    from orthros_jax.parallel.device_specs import spec_of

    try:
        devices = aot.target_devices(_TARGET.value)
        spec = spec_of(devices[0].device_kind)
        program = aot.program_of(_CONFIG.value, devices)
        rec = aot.compile_program(program, spec)
    except ValueError as e:
        raise SystemExit(f"compile.py: {e}") from None
    rec["target"] = _TARGET.value
    rec["command"] = "python launch/compile.py " + shlex.join(sys.argv[1:]).replace(
        "--config.mesh.", "--mesh."
    )
    os.makedirs(_OUT.value, exist_ok=True)
    hlo = rec.pop("hlo_text", None)
    if hlo is not None:  # the optimized program, for reading its collectives and kernels
        with gzip.open(os.path.join(_OUT.value, "hlo.txt.gz"), "wt") as f:
            f.write(hlo)
    with open(os.path.join(_OUT.value, "compile.json"), "w") as f:
        json.dump(rec, f, indent=1)
    table = aot_table.markdown(rec, rec["command"])
    with open(os.path.join(_OUT.value, "compile.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    app.run(main)
