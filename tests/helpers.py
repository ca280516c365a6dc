"""What many test files share: the tiny model config and parameter-tree helpers.

Test modules import these by name (`from helpers import tiny_config`): pytest puts this
directory on sys.path, and module-level constants and parametrize lists cannot use fixtures.
"""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
from typing import Any

import jax

from orthros_jax.config import ModelConfig
from orthros_jax.layers import registry

# 2 layers, d_model 32, 4 query / 2 kv heads of 8 (G = 2), SwiGLU 64, window 8: GQA and two
# streams at a size that compiles in seconds. Tests override what they are about.
TINY = dict(
    vocab_size=256,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=64,
    window=8,
    attention_block_cache_kib=2,  # cached reads over several blocks, as at long context
)


def validated(**fields: Any) -> ModelConfig:
    """ModelConfig(**fields) checked against the layer registry too (registry.validate: what a
    model build checks first)."""
    cfg = ModelConfig(**fields)
    registry.validate(cfg)
    return cfg


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


def convert_cli_to_orthros(hf_dir: Any, out: Any, window: int) -> None:
    """launch/convert.py --architecture=orthros of a saved Hugging Face dir (asserts success)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(root, "launch", "convert.py"),
            f"--hf_dir={hf_dir}",
            f"--out={out}",
            "--architecture=orthros",
            f"--window={window}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def hf_logits(model: Any, tokens: Any) -> Any:
    """A transformers model's float32 logits [B, T, V] (numpy) for int tokens [B, T]."""
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.float().numpy()


@functools.cache
def _forward(cfg: ModelConfig) -> Any:
    """One jitted forward per config: every call with that config's shapes shares a program."""
    from orthros_jax.model import OrthrosLM

    return jax.jit(lambda p, t: OrthrosLM(cfg).apply({"params": p}, t))


def our_logits(cfg: ModelConfig, params: Any, tokens: Any) -> Any:
    """OrthrosLM(cfg)'s logits [B, T, V] (numpy) at params for int tokens [B, T]."""
    import jax.numpy as jnp
    import numpy as np

    fn = _forward(cfg)
    return np.asarray(fn(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens)))


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now (for a server or a coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
