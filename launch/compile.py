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
An inference config of mode "speculative" (configs/decode_8b.py:speculative) compiles the
decode, draft and verify programs of self-speculative decoding and projects bytes per accepted
token (benchmarks/aot_spec.py).
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
    from benchmarks import aot, aot_spec, aot_table
    from orthros_jax.parallel.device_specs import spec_of

    speculative = aot_spec.is_speculative(_CONFIG.value)
    try:
        devices = aot.target_devices(_TARGET.value)
        spec = spec_of(devices[0].device_kind)
        if speculative:  # several programs, one record
            rec = aot_spec.compile_speculative(_CONFIG.value, devices, spec)
        else:
            rec = aot.compile_program(aot.program_of(_CONFIG.value, devices), spec)
    except ValueError as e:
        raise SystemExit(f"compile.py: {e}") from None
    rec["target"] = _TARGET.value
    rec["command"] = "python launch/compile.py " + shlex.join(sys.argv[1:]).replace(
        "--config.mesh.", "--mesh."
    )
    os.makedirs(_OUT.value, exist_ok=True)
    # The optimized programs, for reading their collectives and kernels: hlo.txt.gz, or
    # hlo_<program>.txt.gz for a speculative record's programs.
    hlos = {"hlo": rec.pop("hlo_text", None)}
    for name, r in rec.get("programs", {}).items():
        hlos[f"hlo_{name}"] = r.pop("hlo_text", None)
    for name, hlo in hlos.items():
        if hlo is not None:
            with gzip.open(os.path.join(_OUT.value, f"{name}.txt.gz"), "wt") as f:
                f.write(hlo)
    with open(os.path.join(_OUT.value, "compile.json"), "w") as f:
        json.dump(rec, f, indent=1)
    markdown = aot_spec.markdown if speculative else aot_table.markdown
    table = markdown(rec, rec["command"])
    with open(os.path.join(_OUT.value, "compile.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    app.run(main)
