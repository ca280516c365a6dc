"""attention_impl="cudnn": what cuDNN flash attention cannot run is a ValueError naming the case
(checked on CPU, before any compile); where jax-cuda12-plugin is installed, a tiny bf16 train
step and prefill compile for the H100 target with cuDNN's fused attention in the program."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from helpers import tiny_config

from benchmarks.aot import has_gpu_compiler
from orthros_jax.model import OrthrosLM, init_params

# About compiled programs (memory, fits, custom calls): XLA's default pipeline (conftest.py).
pytestmark = pytest.mark.optimized
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _forward(cfg, t: int = 16, packed: bool = False):
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.zeros((2, t), jnp.int32)
    kwargs = {}
    if packed:
        kwargs = {
            "positions": jnp.tile(jnp.arange(t), (2, 1)),
            "segment_ids": jnp.ones((2, t), jnp.int32),
        }
    return OrthrosLM(cfg).apply({"params": params}, tokens, **kwargs)


@pytest.mark.slow
def test_float32_is_refused_by_name():
    with pytest.raises(
        ValueError, match=r"attention_impl='cudnn' needs ModelConfig.dtype in .*got float32"
    ):
        _forward(tiny_config(attention_impl="cudnn"))


@pytest.mark.slow
def test_head_dim_not_a_multiple_of_8_is_refused():
    cfg = tiny_config(attention_impl="cudnn", dtype="bfloat16", head_dim=12)
    with pytest.raises(
        ValueError, match="head_dim a multiple of 8 and <= 256; got ModelConfig.head_dim=12"
    ):
        _forward(cfg)


@pytest.mark.slow
def test_head_dim_above_256_is_refused():
    cfg = tiny_config(attention_impl="cudnn", dtype="float16", head_dim=264)
    with pytest.raises(ValueError, match="head_dim=264"):
        _forward(cfg)


@pytest.mark.skipif(
    not has_gpu_compiler(),
    reason="needs jax-cuda12-plugin and jax-cuda12-pjrt (pip install --no-deps)",
)
@pytest.mark.parametrize("config", ["train", "prefill"])
def test_compiles_for_h100_with_cudnn_attention(tmp_path, config):
    tiny = [
        "--config.model.attention_impl=cudnn",
        "--config.model.dtype=bfloat16",
        "--config.model.head_dim=64",
    ]
    if config == "train":  # a packed PT step: the mask goes in as a bias
        args = ["--config=configs/tiny_pt.py", "--mesh.data=1", "--mesh.fsdp=-1", *tiny]
    else:  # one unpacked prompt in chunks of 2048 (is_causal + local window), 2 rows on 2 GPUs
        args = [
            "--config=configs/prefill_8b.py",
            "--config.model.n_layers=2",
            "--config.model.d_model=512",
            "--config.model.n_heads=8",
            "--config.model.n_kv_heads=2",
            "--config.model.d_ff=1024",
            "--config.model.vocab_size=1024",
            "--config.model.head_dim=64",
            "--config.model.prefill_chunk=2048",
            "--config.model.attention_impl=cudnn",
            "--config.inference.batch_size=2",
            "--config.inference.prompt_len=4096",
            "--config.inference.max_len=4096",
            "--mesh.data=2",
        ]
    target = "h100x8" if config == "train" else "h100x2"
    cmd = [sys.executable, "launch/compile.py", f"--target={target}", f"--out={tmp_path}", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]), JAX_PLATFORMS="cpu")
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    rec = json.loads((tmp_path / "compile.json").read_text())
    assert rec["device"]["name"] == "H100 SXM" and rec["fits"]
    assert any(c.startswith("__cudnn$fmha") for c in rec["custom_calls"]), rec["custom_calls"]


on_gpu = pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN runs on an NVIDIA GPU")
BF16_TOL = 3e-2  # bf16 activations: xla and cuDNN round the scores and probabilities differently


@on_gpu
@pytest.mark.parametrize("arch", ["orthros", "transformer", "swa"])
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_logits_and_grads_match_xla_in_bf16(arch, packed):
    import numpy as np

    cfg = tiny_config(architecture=arch, dtype="bfloat16", head_dim=64, window=16)
    params = init_params(cfg, jax.random.PRNGKey(0))
    t = 128
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, t), 0, cfg.vocab_size)
    kw = {}
    if packed:
        seg = jnp.where(jnp.arange(t) < 50, 1, 2)[None].repeat(2, 0)
        pos = jnp.where(jnp.arange(t) < 50, jnp.arange(t), jnp.arange(t) - 50)[None].repeat(2, 0)
        kw = {"positions": pos, "segment_ids": seg}

    def run(impl):
        model = OrthrosLM(cfg.replace(attention_impl=impl))
        f = lambda p: model.apply({"params": p}, tokens, **kw)
        return jax.jit(f)(params), jax.jit(jax.grad(lambda p: f(p).mean()))(params)

    (lx, gx), (lc, gc) = run("xla"), run("cudnn")
    np.testing.assert_allclose(np.asarray(lc), np.asarray(lx), atol=BF16_TOL * 10, rtol=BF16_TOL)
    for a, b in zip(jax.tree.leaves(gc), jax.tree.leaves(gx), strict=True):
        scale = float(jnp.abs(b).max()) + 1e-6
        assert float(jnp.abs(a - b).max()) <= BF16_TOL * scale


@on_gpu
def test_gpu_prefill_and_decode_match_xla_in_bf16():
    import numpy as np

    from orthros_jax import inference as inf

    cfg = tiny_config(dtype="bfloat16", head_dim=64, window=16, prefill_chunk=64)
    params = init_params(cfg, jax.random.PRNGKey(0))
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 192)).astype(np.int32)
    out = {}
    for impl in ("xla", "cudnn"):
        c = cfg.replace(attention_impl=impl)
        cache = inf.init_cache(c, 2, 256)
        logits, cache = inf.prefill(params, cache, prompts, np.array([192, 150]), c)
        step, cache = inf.decode_step(params, cache, np.array([1, 2]), c)
        out[impl] = np.stack([np.asarray(logits, np.float32), np.asarray(step, np.float32)])
    np.testing.assert_allclose(out["cudnn"], out["xla"], atol=BF16_TOL * 10, rtol=BF16_TOL)
