"""pytest hooks and fixtures only: the Qwen3.5 torch-path import, XLA's optimization switch
for the CLIs the tests start. What test modules import by name (the tiny config, parameter
helpers) lives in helpers.py."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator

import jax
import pytest


def _qwen35_on_torch_paths() -> None:
    """transformers' Qwen3.5 and Qwen3.5-MoE layers pick flash-linear-attention's Triton kernels
    when `fla` imports (its decorator tries the package when the modeling module is imported),
    and those cannot run on a CPU. With fla and triton installed (the convert extra: fla's own
    models are the GLA / RetNet references), import those modules once with fla hidden, so the
    Hugging Face references take transformers' torch path whichever test imports fla first."""
    if importlib.util.find_spec("transformers") is None or "fla" in sys.modules:
        return
    sys.modules["fla"] = None  # type: ignore[assignment]  # makes `import fla` raise ImportError
    try:
        for name in ("qwen3_5.modeling_qwen3_5", "qwen3_5_moe.modeling_qwen3_5_moe"):
            try:
                importlib.import_module(f"transformers.models.{name}")
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


@pytest.fixture(scope="module")
def unoptimized_compiles() -> Iterator[None]:
    """For a module whose tests check the values of tiny programs, not compiled code: it
    compiles in this process without XLA's optimizing passes, which cost more than they save at
    this size (test_kind_conformance's PT/SFT case 32 -> 14 s, the file 20 -> 11 min)."""
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs() -> Iterator[None]:
    """After each test module, drop jax's compiled programs and traces: a pytest-xdist worker
    runs hundreds of modules, and what they compiled otherwise stays alive to the end (CI saw
    two workers die late in the run, in XLA:CPU, with tests that pass alone)."""
    yield
    import gc

    jax.clear_caches()
    gc.collect()
