"""What many test files share: the tiny model config and parameter-tree helpers.

Test modules import these by name (`from conftest import tiny_config`): pytest puts this
directory on sys.path, and module-level constants and parametrize lists cannot use fixtures.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import Any

import jax
import pytest

from orthros_jax.config import ModelConfig


def _qwen35_on_torch_paths() -> None:
    """transformers' Qwen3.5 layers pick flash-linear-attention's Triton kernels when `fla`
    imports (its decorator tries the package when the modeling module is imported), and those
    cannot run on a CPU. With fla and triton installed (the convert extra: fla's own models are
    the GLA / RetNet references), import that module once with fla hidden, so the Hugging Face
    references take transformers' torch path whichever test imports fla first."""
    if importlib.util.find_spec("transformers") is None or "fla" in sys.modules:
        return
    sys.modules["fla"] = None  # type: ignore[assignment]  # makes `import fla` raise ImportError
    try:
        importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5")
    except ImportError:
        pass
    finally:
        del sys.modules["fla"]


_qwen35_on_torch_paths()

# The CLIs the tests start (train, benchmark, serve, ... on tiny models) spend most of their time
# compiling, and at these sizes XLA's optimizing passes cost more than they save: they inherit
# JAX_DISABLE_MOST_OPTIMIZATIONS=1 (test_benchmark's end-to-end run: 109 -> 65 s). The test
# processes themselves keep XLA's default pipeline: with it off in long-lived pytest workers,
# XLA:CPU's compiler crashed twice in a few hundred compiles. Tests marked `optimized` (about
# compiled programs: TPU / GPU compiles, memory, custom calls) give their subprocesses the
# default pipeline too.
_NO_OPT = "JAX_DISABLE_MOST_OPTIMIZATIONS"
os.environ.setdefault(_NO_OPT, "1")
jax.config.update("jax_disable_most_optimizations", False)  # this process: read at import


@pytest.fixture(autouse=True)
def _xla_optimizations(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("optimized") is None:
        yield
        return
    before = os.environ[_NO_OPT]
    os.environ[_NO_OPT] = "0"
    try:
        yield
    finally:
        os.environ[_NO_OPT] = before


# 2 layers, d_model 32, 4 query / 2 kv heads of 8 (G = 2), SwiGLU 64, window 8: GQA and two
# streams at a size that compiles in seconds. Tests override what they are about.
TINY = dict(
    vocab_size=256, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, window=8
)  # fmt: skip


def tiny_config(**changes: Any) -> ModelConfig:
    """The tests' tiny ModelConfig (TINY) with `changes` applied; the arm defaults to orthros."""
    return ModelConfig(**(TINY | changes))


def single_stream(params: dict[str, Any]) -> dict[str, Any]:
    """The same shared weights without the scale-offset vectors: the transformer/swa layout."""
    layers = {k: v for k, v in params["layers"].items() if not k.startswith("so_")}
    return {**params, "layers": layers}


def randomize_so(params: dict[str, Any], seed: int, scale: float) -> dict[str, Any]:
    """params with scale * N(0, 1) added to every scale-offset vector (one key per vector, in
    sorted name order from PRNGKey(seed)), so the two streams' queries differ."""
    layers = dict(params["layers"])
    for i, name in enumerate(sorted(n for n in layers if n.startswith("so_"))):
        noise = jax.random.normal(jax.random.PRNGKey(seed + i), layers[name].shape)
        layers[name] = layers[name] + scale * noise
    return {**params, "layers": layers}
