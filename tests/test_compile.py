"""launch/compile.py and benchmarks/aot.py: tiny train / prefill / decode programs compiled by
the real TPU compiler (libtpu, the `tpu` extra) for v5e:2x2 on this CPU, their figures, and the
errors for a bad target, a mismatched mesh and a missing compiler. Skipped without libtpu."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import ml_collections
import pytest

pytest.importorskip("libtpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other test processes may hold it

from benchmarks import aot  # noqa: E402
from benchmarks.hlo_loops import loop_weighted_collective_bytes  # noqa: E402
from orthros_jax.config import ModelConfig  # noqa: E402
from orthros_jax.config.cli import load_config_file, section  # noqa: E402
from orthros_jax.layers import flops  # noqa: E402
from orthros_jax.parallel.device_specs import SPECS, spec_of  # noqa: E402

# About compiled programs (memory, fits, custom calls): XLA's default pipeline (conftest.py).
pytestmark = pytest.mark.optimized
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = "v5e:2x2"
TINY_MODEL = dict(
    vocab_size=256,
    d_model=128,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=128,
    d_ff=256,
    window=128,
    dtype="bfloat16",
    param_dtype="bfloat16",
    prefill_chunk=256,
)


@pytest.fixture(scope="module")
def devices():
    return aot.target_devices(TARGET)


def _inference(mode: str, **mesh) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.model = section(ModelConfig(**TINY_MODEL, attention_impl="splash"))
    c.inference = {"mode": mode, "batch_size": 4, "prompt_len": 512, "max_len": 512}
    c.mesh = {"data": 1, "sequence": 1, "tensor": 1} | mesh
    return c


@pytest.mark.slow
def test_train_step_with_splash_compiles_for_v5e_and_reports(tmp_path):
    out = tmp_path / "aot"
    cmd = [
        sys.executable,
        "launch/compile.py",
        "--config=configs/tiny_pt.py",
        f"--target={TARGET}",
        "--mesh.data=1",
        "--mesh.fsdp=-1",
        "--config.model.attention_impl=splash",
        "--config.model.dtype=bfloat16",
        "--config.model.head_dim=128",
        "--config.model.n_layers=1",  # the TPU compile's cost grows with the layers, not its checks
        f"--out={out}",
    ]
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    rec = json.loads((out / "compile.json").read_text())
    cfg = load_config_file("configs/tiny_pt.py")
    model = ModelConfig.from_dict(
        {**cfg.model, "dtype": "bfloat16", "head_dim": 128, "n_layers": 1}
    )
    bsz, t = cfg.data.batch_size, cfg.data.seq_len
    assert rec["devices"] == 4 and rec["summary"]["mesh"] == {
        "data": 1,
        "fsdp": 4,
        "tensor": 1,
        "expert": 1,
    }
    assert rec["flops_per_step"] == 3 * bsz * flops.pt_forward_flops(
        model.replace(attention_impl="splash"), t
    )
    assert "tpu_custom_call" in rec["custom_calls"]  # the splash kernels are in the program
    b = rec["bytes_per_device"]
    assert b["peak"] == b["argument"] + b["output"] - b["alias"] + b["temp"] > 0
    assert rec["fits"] and rec["headroom_bytes"] == SPECS["TPU v5 lite"].hbm_bytes - b["peak"]
    # fsdp: the parameters are all-gathered and the gradients reduce-scattered / all-reduced.
    assert rec["collective_bytes_per_device"]["all-gather"] > 0
    r = rec["roofline_s"]
    assert r["step"] == max(r["compute"], r["memory"], r["collectives"])
    assert 0 < rec["mfu_bound"] <= 1
    assert "| fits | fits" in (out / "compile.md").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_inference_programs_compile_with_tensor_parallel_heads(devices, mode):
    program = aot.program_of(_inference(mode, data=2, tensor=2), devices)
    rec = aot.compile_program(program, spec_of(devices[0].device_kind))
    cfg = ModelConfig(**TINY_MODEL)
    want = 4 * (
        flops.prefill_flops(cfg, 512) if mode == "prefill" else flops.decode_flops(cfg, 512)
    )
    assert rec["flops_per_step"] == want
    assert rec["fits"] and rec["bytes_per_device"]["argument"] > 0
    # Prefill chunks of 256 go to the kernel; a decode step is the few-query path (no kernel).
    assert ("tpu_custom_call" in rec["custom_calls"]) == (mode == "prefill")


@pytest.mark.slow
def test_sequence_parallel_prefill_compiles(devices):
    program = aot.program_of(_inference("prefill", sequence=4), devices)
    rec = aot.compile_program(program, spec_of(devices[0].device_kind))
    assert rec["summary"]["mesh"] == {"data": 1, "sequence": 4}
    assert rec["collective_bytes_per_device"]["collective-permute"] > 0  # the window's halo
    assert "tpu_custom_call" in rec["custom_calls"]  # chunks with their halo: the kernel


def test_errors_name_the_problem(devices, monkeypatch):
    with pytest.raises(ValueError, match="unknown target 'v5e:1x1x1x1'"):
        aot.target_devices("v5e:1x1x1x1")
    with pytest.raises(ValueError, match="needs 8 devices; the target has 4"):
        aot.program_of(_inference("decode", data=8), devices)
    train = load_config_file("configs/tiny_pt.py")
    train.mesh.data, train.mesh.fsdp = 3, 1
    with pytest.raises(ValueError, match="mesh .* has 3 devices, but 4 are available"):
        aot.program_of(train, devices)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "libtpu" else real(n, *a)
    )
    with pytest.raises(ValueError, match=r"needs the TPU compiler: pip install -e '\.\[tpu\]'"):
        aot.target_devices(TARGET)


def test_missing_gpu_compiler_is_a_value_error(monkeypatch):
    # A fresh machine has no jax_plugins namespace at all: find_spec of its submodule would
    # raise ModuleNotFoundError, so the probe must come back False, and the target a ValueError.
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "jax_plugins" else real(n, *a)
    )
    assert not aot.has_gpu_compiler()
    with pytest.raises(
        ValueError, match="needs the GPU compiler: pip install --no-deps jax-cuda12-plugin"
    ):
        aot.target_devices("h100x2")


def test_cli_error_is_one_line(tmp_path):
    cmd = [sys.executable, "launch/compile.py", "--target=tpu9:2x2", f"--out={tmp_path}"]
    res = subprocess.run(
        cmd,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1].startswith("compile.py: unknown target 'tpu9:2x2'")


def test_loop_weighted_collectives():
    # An all-reduce of f32[4] (16 B) in a body run 3 times, one of bf16[8] (16 B) in the entry.
    hlo = """HloModule m

%body.1 (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %ar = f32[4]{0} all-reduce(f32[4]{0} %x), to_apply=%add.0
  ROOT %t = (s32[], f32[4]) tuple(%i, %ar)
}

%cond.1 (p: (s32[], f32[4])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %w = (s32[], f32[4]) while(%init), condition=%cond.1, body=%body.1, backend_config={"known_trip_count":{"n":"3"}}
  %g = bf16[8]{0} all-gather(bf16[2]{0} %y), dimensions={0}
  ROOT %r = f32[4] get-tuple-element(%w), index=1
}
"""  # noqa: E501 (an HLO line as the compiler writes it)
    got = loop_weighted_collective_bytes(hlo)

    assert got["all-reduce"] == 3 * 16 and got["all-gather"] == 16
    assert sum(got.values()) == 64
    # Without known_trip_count (the TPU compiler's HLO) the condition's `i < 5` bounds the loop.
    no_count = hlo.replace(', backend_config={"known_trip_count":{"n":"3"}}', "")
    no_count = no_count.replace("compare(%i, %n)", "compare(%i, %five)").replace(
        "  ROOT %lt", "  %five = s32[] constant(5)\n  ROOT %lt"
    )
    assert loop_weighted_collective_bytes(no_count)["all-reduce"] == 5 * 16
    # A backend_config written over several lines (as the TPU compiler writes the splash
    # kernel's) does not end the loop body: the all-reduce after it is still weighted by 3.
    multiline = hlo.replace(
        "  %ar = f32[4]",
        '  %k = f32[4]{0} custom-call(%x), backend_config={"m":"{\\"a\\": 1,\n}}", x=1\n'
        "  %ar = f32[4]",
    )
    assert multiline.count("\n}}") == 1
    assert loop_weighted_collective_bytes(multiline)["all-reduce"] == 3 * 16


def _speculative(**inference) -> ml_collections.ConfigDict:
    c = _inference("decode")
    c.inference = {
        "mode": "speculative",
        "batch_size": 2,
        "max_len": 1024,
        "spec_ks": (2,),
        "acceptance": (2.5,),
        "draft_window": 0,
    } | inference
    return c


@pytest.mark.slow
def test_speculative_programs_compile_and_project(devices):
    from benchmarks import aot_spec

    c = _speculative()
    c.model.n_layers = 4  # the programs as configured (scanned); counted at 2 and 3 layers
    rec = aot_spec.compile_speculative(c, devices, spec_of(devices[0].device_kind))
    progs = rec["programs"]
    assert list(progs) == ["decode", "draft", "verify_k2"]
    assert rec["summary"]["draft_window"] == 128  # 0: the model's window
    assert progs["decode"]["fits"]  # compiled as configured for its memory, the others not
    # One slot of every row in every layer: 4 layers x 2 rows x 2 kv heads x 128 x (K, V) x bf16.
    slot = 4 * 2 * 2 * 128 * 2 * 2
    assert rec["slot_bytes"] == slot
    b = {}
    for name, r in progs.items():
        two, three = (x["bytes accessed"] for x in r["cost_2_3_layers"])
        b[name] = r["cost_analysis"]["bytes accessed"]
        assert b[name] == two + 2 * (three - two)  # extrapolated to the 4 layers
    # Plain decode's global queries read all 1024 slots, the draft's only the last 128.
    assert b["draft"] < b["decode"]
    (row,) = rec["rounds"]
    step, draft = b["decode"] + slot, b["draft"] + slot  # reads + the slot each step writes
    verify = b["verify_k2"] + slot  # + the last draft's K/V
    assert row["round_bytes"] == pytest.approx(2 * draft + verify, rel=1e-12)
    assert row["projected_speedup"] == pytest.approx(step * 2.5 / (2 * draft + verify), rel=1e-12)
    # The cost model: Orthros reads W + (T + w) b per plain step, W + (w + w_d) b per draft
    # step and W + (T + w) b per verify pass (T 1024 slots, w = w_d = 128), k = 2 drafts.
    w_b = rec["weight_bytes"]
    model_round = 2 * (w_b + 256 * slot) + w_b + 1152 * slot
    assert row["model_round_over_step"] == pytest.approx(model_round / (w_b + 1152 * slot))
    assert "| 2 | 2.5 |" in aot_spec.markdown(rec)


@pytest.mark.parametrize(
    ("inference", "model", "match"),
    [
        ({"acceptance": (2.5, 3.0)}, {}, r"inference.acceptance=\(2.5, 3.0\) needs one value"),
        ({"acceptance": (3.5,)}, {}, r"acceptance 3.5 \(tokens per verify\) in \[1, k \+ 1\]"),
        ({"draft_window": 2048}, {}, r"draft_window=2048 exceeds the cache \(1024 slots\)"),
        ({}, {"architecture": "orthros_h", "layer_types": ("gdn", "attention")}, "roll back"),
    ],
)
def test_speculative_bad_input_before_compile(devices, inference, model, match):
    from benchmarks import aot_spec

    c = _speculative(**inference)
    c.model.update(model)
    with pytest.raises(ValueError, match=match):
        aot_spec.speculative_programs(c, devices)
