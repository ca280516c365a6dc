"""pytest hooks and fixtures only: the Qwen3.5 torch-path import, XLA's optimization switch
for the CLIs the tests start. What test modules import by name (the tiny config, parameter
helpers) lives in helpers.py."""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
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


# The suite runs on the CPU, also where libtpu is installed (the tpu extra: ahead-of-time TPU
# compiles from abstract topologies need no TPU backend): no process probes for a TPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])  # jax read it at import


def _shared_compilation_cache() -> None:
    """One persistent compilation cache for the run: the first pytest process (the xdist
    controller, or a plain run) makes a temp dir and names it in the environment, so the
    workers it starts and every CLI the tests start read and write the same cache, and a
    program compiled once (the tiny models, the CLIs' train steps) is loaded after that. A
    cache dir set by the caller is used as it is (and kept)."""
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        path = tempfile.mkdtemp(prefix="orthros-jax-test-xla-cache-")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = path
        atexit.register(shutil.rmtree, path, True)
    # Every program, however quick its compile: the tiny models compile in well under a second.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
    # This process imported jax above, before the environment named the cache.
    env = os.environ
    jax.config.update("jax_compilation_cache_dir", env["JAX_COMPILATION_CACHE_DIR"])
    secs = float(env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", secs)
    size = int(env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"])
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", size)


_shared_compilation_cache()

# XLA:CPU's fusion emitters (its default code generator) take about twice as long to compile
# the tests' programs as its older loop emitters, for the same results (a 4-layer orthros_h
# gradient: 7.2 -> 3.5 CPU-s). XLA reads XLA_FLAGS when the backend starts, after this; the
# xdist workers and the CLIs the tests start inherit it (training_helpers.subprocess_env keeps
# it beside a device count).
# A caller's own setting of the flag wins.
_FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"
if "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

# The tests check the values of tiny programs, and at these sizes XLA's optimizing passes cost
# more than they save: the test processes and the CLIs they start (which inherit
# JAX_DISABLE_MOST_OPTIMIZATIONS=1) compile without them. Tests marked `optimized` are about
# compiled programs (TPU / GPU compiles, memory, in-place updates, custom calls): they and their
# subprocesses compile with XLA's default pipeline.
_NO_OPT = "JAX_DISABLE_MOST_OPTIMIZATIONS"
os.environ.setdefault(_NO_OPT, "1")
jax.config.update("jax_disable_most_optimizations", os.environ[_NO_OPT] == "1")


@pytest.fixture(autouse=True)
def _xla_optimizations(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("optimized") is None:
        yield
        return
    env, flag = os.environ[_NO_OPT], jax.config.read("jax_disable_most_optimizations")
    os.environ[_NO_OPT] = "0"
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        os.environ[_NO_OPT] = env
        jax.config.update("jax_disable_most_optimizations", flag)


# XLA:CPU maps each loaded executable's code into memory, and Linux refuses a process's mmap
# past vm.max_map_count (65,530 by default): a worker that keeps too many compiled programs
# alive dies inside XLA, in whichever test compiles next. So a worker drops jax's compiled
# programs once its maps pass MAX_MAPS, and keeps them otherwise: the tiny models that later
# modules reuse stay compiled, and a dropped program reloads from the run's persistent cache.
# Figures and the reproduction: docs/contributing.md ("What keeps it fast").
MAX_MAPS = 20_000


def _mapped_regions() -> int:
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to guard
        return 0


@pytest.fixture(autouse=True)
def _bounded_live_programs() -> Iterator[None]:
    yield
    if _mapped_regions() > MAX_MAPS:
        import gc

        jax.clear_caches()
        gc.collect()
