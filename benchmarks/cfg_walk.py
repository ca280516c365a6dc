"""The walk of the model config through `training/loop.py:train`: which orthros_jax modules a
tiny 2-step train (its config built from configs/tiny_pt.py included) enters with a
ModelConfig in hand, and how often a call climbs back up the package order of
tests/test_layout.py (a lower floor calling a higher one, e.g. the config calling layers/).

    PYTHONPATH=. python benchmarks/cfg_walk.py [--workdir /tmp/cfg_walk]

A call counts when the called orthros_jax function has a ModelConfig among its arguments (or
one reachable as `.model` of a TrainConfig), or is the configuration's own code. Prints the
modules with their entry counts, the configuration modules among them, the rooms (packages, or
modules at the package root) and the climbs. `PYTHONPATH=<an older checkout>` measures it.
Figures: docs/contributing.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # test_layout: the package order

from test_layout import ORDER, _package  # noqa: E402

from orthros_jax.config import ModelConfig  # noqa: E402
from orthros_jax.training import TrainConfig  # noqa: E402

PKG = str(ROOT / "orthros_jax") + os.sep
# The configuration: the config package, and the root modules that held it before it.
CONFIG_MODULES = ("config", "config_registry", "configlib", "options", "moe_options", "arms")


def _module(filename: str) -> str | None:
    if not filename.startswith(PKG):
        return None
    rel = pathlib.Path(filename).relative_to(ROOT).with_suffix("").parts
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _is_config_module(module: str) -> bool:
    return module.split(".")[1] in CONFIG_MODULES


def _room(module: str) -> str:
    """A module's room: its package (orthros_jax.layers, ...), or itself at the root."""
    return ".".join(module.split(".")[:2])


def _holds_cfg(frame: Any) -> bool:
    code = frame.f_code
    for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        v = frame.f_locals.get(name)
        if isinstance(v, ModelConfig) or isinstance(getattr(v, "model", None), ModelConfig):
            return True
    return False


def walk(workdir: str) -> dict[str, Any]:
    """Builds the tiny TrainConfig and runs train() on it under sys.setprofile; returns the
    rooms and climbs."""
    from orthros_jax.training.loop import train

    entries: collections.Counter[str] = collections.Counter()
    climbs: collections.Counter[tuple[str, str]] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = _module(frame.f_code.co_filename)
        if module is None or not (_is_config_module(module) or _holds_cfg(frame)):
            return
        entries[module] += 1
        caller = _module(frame.f_back.f_code.co_filename) if frame.f_back else None
        if caller is not None and caller != module:
            if ORDER.index(_package(module)) > ORDER.index(_package(caller)):
                climbs[(caller, module)] += 1

    sys.setprofile(profile)
    try:
        train(tiny_train_config(), workdir)
    finally:
        sys.setprofile(None)
    return {"entries": entries, "climbs": climbs}


def tiny_train_config() -> TrainConfig:
    """configs/tiny_pt.py at test size, 2 steps, no periodic checkpoint or eval."""
    try:
        from orthros_jax.config.cli import load_config_file
    except ImportError:  # the tree before the config package (to measure "before")
        from orthros_jax.configlib import load_config_file  # type: ignore[no-redef]

    c = load_config_file(str(ROOT / "configs" / "tiny_pt.py"))
    c.model.update(dict(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64))
    c.model.update(dict(window=16, attention_block_q=32, attention_block_k=32))
    c.data.update(dict(seq_len=64, batch_size=4))
    c.train.update(dict(steps=2, eval_every=0, eval_batches=1, checkpoint_every=0))
    c.train.progress_bar = False
    return TrainConfig.from_config(c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="cfg_walk_")
    out = walk(workdir)
    entries, climbs = out["entries"], out["climbs"]
    print(f"modules entered with the config: {len(entries)}")
    for m, n in sorted(entries.items(), key=lambda kv: (ORDER.index(_package(kv[0])), kv[0])):
        print(f"  {m:45s} {n:7d}{'  (configuration)' if _is_config_module(m) else ''}")
    config_rooms = [m for m in entries if _is_config_module(m)]
    print(f"configuration modules entered: {len(config_rooms)} ({', '.join(sorted(config_rooms))})")
    rooms = sorted({_room(m) for m in entries})
    config_packages = sorted({_room(m) for m in config_rooms})
    print(f"rooms (packages, or root modules): {len(rooms)} ({', '.join(rooms)})")
    print(f"  of them configuration: {len(config_packages)} ({', '.join(config_packages)})")
    print(f"climbs up the package order: {len(climbs)} edges, {sum(climbs.values())} calls")
    for (a, b), n in sorted(climbs.items()):
        print(f"  {a} -> {b}: {n}")


if __name__ == "__main__":
    main()
